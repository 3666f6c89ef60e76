// CRC-32 (ISO-HDLC, the zip/zlib/PNG polynomial 0xEDB88320, reflected), fast
// enough to verify and write multi-gigabyte zip records at disk speed.
//
// `Crc32` picks at first use the fastest implementation the CPU supports:
// the same folding with 256-bit VPCLMULQDQ (~2.5x the 128-bit rate),
// PCLMULQDQ folding (Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ", ~10+ GB/s) or table-driven slicing-by-16
// (~3-5 GB/s).
// The value is zlib's `crc32()`: start from 0 and chain.
//
// Example:
//   uint32_t crc = Crc32(0, header.data(), header.size());
//   crc = Crc32(crc, payload.data(), payload.size());
#ifndef UCP_FORMAT_TORCH_CRC32_H_
#define UCP_FORMAT_TORCH_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace ucp::torch {

// The CRC-32 of `data` appended to a stream whose CRC so far is `crc`.
uint32_t Crc32(uint32_t crc, const void* data, size_t len);

// The CRC-32 of A followed by B, from crc_a = Crc32(0, A), crc_b = Crc32(0, B)
// and B's length (zlib's crc32_combine): lets pieces of one zip record be
// checksummed by different threads or processes and the record's CRC be
// formed afterwards, without reading the bytes again. O(log len_b).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

namespace internal_crc32 {
// The implementations, exposed for tests and benchmarks.
uint32_t Crc32Bytewise(uint32_t crc, const void* data, size_t len);
uint32_t Crc32Slicing16(uint32_t crc, const void* data, size_t len);
// Requires HasPclmul(); falls back to slicing for short inputs.
uint32_t Crc32Pclmul(uint32_t crc, const void* data, size_t len);
bool HasPclmul();
// 256-bit VPCLMULQDQ folding, 128 bytes a step (AVX2 + VPCLMULQDQ CPUs);
// requires HasVpclmul256(); shorter inputs go to Crc32Pclmul.
uint32_t Crc32Vpclmul(uint32_t crc, const void* data, size_t len);
bool HasVpclmul256();
}  // namespace internal_crc32

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_CRC32_H_
