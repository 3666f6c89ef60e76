#include "format/torch/zip.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flusher.h"
#include "base/phases.h"
#include "format/torch/crc32.h"
#include "format/torch/mapped_file.h"

namespace ucp::torch {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndOfCentralDirSig = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kDataDescriptorSig = 0x08074b50;
constexpr uint16_t kZip64ExtraId = 0x0001;

constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndOfCentralDirSize = 22;
constexpr size_t kZip64EndOfCentralDirSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint64_t kMax32 = 0xFFFFFFFF;
constexpr uint16_t kMax16 = 0xFFFF;

constexpr uint16_t kFlagEncrypted = 0x0001;
constexpr uint16_t kFlagDataDescriptor = 0x0008;
constexpr uint16_t kFlagUtf8 = 0x0800;

// torch's kFieldAlignment: record data starts at a multiple of this.
constexpr uint64_t kDataAlignment = 64;

// Debian's Abseil has its own string_view type; messages take this one.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
uint64_t Le64(const uint8_t* p) { return uint64_t{Le32(p)} | (uint64_t{Le32(p + 4)} << 32); }

void Put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xFF));
  s.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& s, uint32_t v) {
  Put16(s, static_cast<uint16_t>(v & 0xFFFF));
  Put16(s, static_cast<uint16_t>(v >> 16));
}
void Put64(std::string& s, uint64_t v) {
  Put32(s, static_cast<uint32_t>(v & kMax32));
  Put32(s, static_cast<uint32_t>(v >> 32));
}

// a + b, false on overflow.
bool AddOk(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }

// The zip64 extended-information field in an extra block, if any.
struct Zip64Field {
  bool present = false;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Walks an extra block; kDataLoss when a field overruns it.
absl::Status FindZip64Field(const uint8_t* extra, size_t len, Zip64Field* out, const std::string& where) {
  size_t pos = 0;
  while (pos < len) {
    if (len - pos < 4) {
      return absl::DataLossError(absl::StrCat(where, ": truncated extra field header"));
    }
    uint16_t id = Le16(extra + pos);
    uint16_t size = Le16(extra + pos + 2);
    if (size > len - pos - 4) {
      return absl::DataLossError(absl::StrCat(where, ": extra field 0x", absl::Hex(id), " of ", size,
                                              " bytes overruns the extra block"));
    }
    if (id == kZip64ExtraId && !out->present) {
      out->present = true;
      out->data = extra + pos + 4;
      out->size = size;
    }
    pos += 4 + size;
  }
  return absl::OkStatus();
}

// Reads the 64-bit values of a zip64 field in spec order, each only when its
// 32-bit counterpart is saturated.
class Zip64Values {
 public:
  Zip64Values(const Zip64Field& f, std::string where) : f_(f), where_(std::move(where)) {}
  absl::Status Resolve(uint64_t* value, bool needed, const char* what) {
    if (!needed) return absl::OkStatus();
    if (!f_.present || f_.size < pos_ + 8) {
      return absl::DataLossError(absl::StrCat(where_, ": ", what, " is 0xFFFFFFFF but the zip64 extra field does not hold it"));
    }
    *value = Le64(f_.data + pos_);
    pos_ += 8;
    return absl::OkStatus();
  }
  absl::Status Resolve32(uint32_t* value, bool needed, const char* what) {
    if (!needed) return absl::OkStatus();
    if (!f_.present || f_.size < pos_ + 4) {
      return absl::DataLossError(absl::StrCat(where_, ": ", what, " is 0xFFFF but the zip64 extra field does not hold it"));
    }
    *value = Le32(f_.data + pos_);
    pos_ += 4;
    return absl::OkStatus();
  }

 private:
  const Zip64Field& f_;
  std::string where_;
  size_t pos_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------
// ZipReader

absl::StatusOr<ZipReader> ZipReader::Open(absl::Span<const uint8_t> archive, std::string name,
                                          const ZipReadOptions& options) {
  ZipReader reader;
  reader.archive_ = archive;
  reader.name_ = std::move(name);
  reader.on_verified_ = options.on_verified;
  reader.keep_alive_ = options.keep_alive;
  absl::Status status = reader.Parse(options);
  if (!status.ok()) return status;
  if (options.crc == ZipReadOptions::Crc::kOnOpen) {
    status = reader.VerifyAllCrcs();
    if (!status.ok()) return status;
  }
  return reader;
}

namespace {

// A kDataLoss error whose message starts with the archive's name.
template <typename... Parts>
absl::Status ArchiveDataLoss(const std::string& archive, const Parts&... parts) {
  return absl::DataLossError(absl::StrCat(archive, ": ", parts...));
}

// The refusal of a multi-disk archive (or record) at `where`.
absl::Status MultiDiskError(const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": multi-disk zip archives are not supported"));
}

// The central directory's place and size as the end records state them
// (zip64 values already substituted for saturated classic ones).
struct EndRecords {
  uint16_t disk = 0, cd_disk = 0;
  uint64_t entries_disk = 0, entries = 0;
  uint64_t cd_size = 0, cd_offset = 0;
  // Nothing of the central directory may pass this: the first end record.
  uint64_t records_end_limit = 0;
};

// Finds the end of central directory record: the last signature whose
// comment length reaches exactly the end of the archive.
absl::StatusOr<uint64_t> FindEndOfCentralDirectory(const uint8_t* base, uint64_t size, const std::string& archive) {
  if (size < kEndOfCentralDirSize) {
    return ArchiveDataLoss(archive, "not a zip archive (", size,
                           " bytes, too short for an end of central directory record)");
  }
  const uint64_t lowest = size - kEndOfCentralDirSize > 0xFFFF ? size - kEndOfCentralDirSize - 0xFFFF : 0;
  for (uint64_t pos = size - kEndOfCentralDirSize + 1; pos-- > lowest;) {
    if (base[pos] == 'P' && Le32(base + pos) == kEndOfCentralDirSig &&
        pos + kEndOfCentralDirSize + Le16(base + pos + 20) == size) {
      return pos;
    }
  }
  return ArchiveDataLoss(archive, "no end of central directory record (not a zip archive, or truncated)");
}

// Reads the zip64 end of central directory record that the locator just
// before the classic record (at `eocd`) points to, checks it against the
// classic fields in `records` and substitutes its 64-bit values.
absl::Status ReadZip64EndRecord(const uint8_t* base, uint64_t eocd, const std::string& archive,
                                EndRecords* records) {
  const uint8_t* loc = base + eocd - kZip64LocatorSize;
  uint32_t z64_disk = Le32(loc + 4);
  uint64_t z64_offset = Le64(loc + 8);
  uint32_t total_disks = Le32(loc + 16);
  if (z64_disk != 0 || total_disks > 1) return MultiDiskError(archive);
  const uint64_t locator_pos = eocd - kZip64LocatorSize;
  if (z64_offset > locator_pos || locator_pos - z64_offset < kZip64EndOfCentralDirSize) {
    return ArchiveDataLoss(archive, "zip64 end of central directory record at offset ", z64_offset,
                           " does not fit before its locator at offset ", locator_pos);
  }
  const uint8_t* z = base + z64_offset;
  if (Le32(z) != kZip64EndOfCentralDirSig) {
    return ArchiveDataLoss(archive, "bad zip64 end of central directory signature at offset ", z64_offset);
  }
  uint64_t record_size = Le64(z + 4);
  uint64_t record_end;
  if (record_size < kZip64EndOfCentralDirSize - 12 || !AddOk(z64_offset + 12, record_size, &record_end) ||
      record_end > locator_pos) {
    return ArchiveDataLoss(archive, "zip64 end of central directory record size ", record_size, " is inconsistent");
  }
  uint32_t z_disk = Le32(z + 16), z_cd_disk = Le32(z + 20);
  uint64_t z_entries_disk = Le64(z + 24), z_entries = Le64(z + 32);
  uint64_t z_cd_size = Le64(z + 40), z_cd_offset = Le64(z + 48);
  if (z_disk != 0 || z_cd_disk != 0) return MultiDiskError(archive);
  // Classic fields are either saturated or equal to the zip64 ones.
  EndRecords& r = *records;
  if ((r.entries_disk != kMax16 && r.entries_disk != z_entries_disk) || (r.entries != kMax16 && r.entries != z_entries) ||
      (r.cd_size != kMax32 && r.cd_size != z_cd_size) || (r.cd_offset != kMax32 && r.cd_offset != z_cd_offset)) {
    return ArchiveDataLoss(archive, "end of central directory and zip64 end of central directory records disagree");
  }
  r.entries_disk = z_entries_disk;
  r.entries = z_entries;
  r.cd_size = z_cd_size;
  r.cd_offset = z_cd_offset;
  r.records_end_limit = z64_offset;
  return absl::OkStatus();
}

// Where the central directory lies: [offset, end), and how many entries it
// holds, as the end records give them, bounded by the archive and the options.
struct CentralDirectoryExtent {
  uint64_t offset = 0, end = 0, entries = 0;
};

absl::StatusOr<CentralDirectoryExtent> LocateCentralDirectory(const uint8_t* base, uint64_t size,
                                                              const std::string& archive,
                                                              const ZipReadOptions& options) {
  absl::StatusOr<uint64_t> eocd_or = FindEndOfCentralDirectory(base, size, archive);
  if (!eocd_or.ok()) return eocd_or.status();
  const uint64_t eocd = *eocd_or;
  const uint8_t* e = base + eocd;
  EndRecords r;
  r.disk = Le16(e + 4);
  r.cd_disk = Le16(e + 6);
  r.entries_disk = Le16(e + 8);
  r.entries = Le16(e + 10);
  r.cd_size = Le32(e + 12);
  r.cd_offset = Le32(e + 16);
  r.records_end_limit = eocd;

  if (eocd >= kZip64LocatorSize && Le32(base + eocd - kZip64LocatorSize) == kZip64LocatorSig) {
    absl::Status s = ReadZip64EndRecord(base, eocd, archive, &r);
    if (!s.ok()) return s;
  } else if (r.disk != 0 || r.cd_disk != 0) {
    return MultiDiskError(archive);
  }
  if (r.entries_disk != r.entries) return MultiDiskError(archive);
  CentralDirectoryExtent cd;
  if (!AddOk(r.cd_offset, r.cd_size, &cd.end) || cd.end > r.records_end_limit) {
    return ArchiveDataLoss(archive, "central directory (offset ", r.cd_offset, ", ", r.cd_size,
                           " bytes) extends past the end records at offset ", r.records_end_limit);
  }
  if (r.entries > r.cd_size / kCentralHeaderSize) {
    return ArchiveDataLoss(archive, "central directory of ", r.cd_size, " bytes cannot hold ", r.entries, " records");
  }
  if (r.entries > options.max_records) {
    return absl::ResourceExhaustedError(
        absl::StrCat(archive, ": ", r.entries, " records exceed the limit of ", options.max_records));
  }
  cd.offset = r.cd_offset;
  cd.entries = r.entries;
  return cd;
}

// Parses central directory entry `i` at `pos` (before `cd_end`) into
// `record`; `*entry_size` is its length with the variable fields.
absl::Status ParseCentralEntry(const uint8_t* base, uint64_t pos, uint64_t cd_end, uint64_t i, uint64_t entries,
                               const std::string& archive, ZipRecord* record, uint64_t* entry_size) {
  if (cd_end - pos < kCentralHeaderSize) {
    return ArchiveDataLoss(archive, "central directory truncated in entry ", i, " of ", entries);
  }
  const uint8_t* h = base + pos;
  if (Le32(h) != kCentralHeaderSig) {
    return ArchiveDataLoss(archive, "bad central directory signature for entry ", i, " at offset ", pos);
  }
  ZipRecord& r = *record;
  r.flags = Le16(h + 8);
  uint16_t method = Le16(h + 10);
  r.crc32 = Le32(h + 16);
  uint64_t csize = Le32(h + 20), usize = Le32(h + 24);
  uint16_t name_len = Le16(h + 28), extra_len = Le16(h + 30), comment_len = Le16(h + 32);
  uint32_t disk_start = Le16(h + 34);
  r.header_offset = Le32(h + 42);
  uint64_t var_len = uint64_t{name_len} + extra_len + comment_len;
  if (cd_end - pos - kCentralHeaderSize < var_len) {
    return ArchiveDataLoss(archive, "central directory entry ", i, " overruns the central directory");
  }
  r.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
  const std::string where = absl::StrCat(archive, ": record '", r.name, "'");
  Zip64Field z64;
  absl::Status s = FindZip64Field(h + kCentralHeaderSize + name_len, extra_len, &z64, where);
  if (!s.ok()) return s;
  Zip64Values values(z64, where);
  if (!(s = values.Resolve(&usize, usize == kMax32, "uncompressed size")).ok()) return s;
  if (!(s = values.Resolve(&csize, csize == kMax32, "compressed size")).ok()) return s;
  if (!(s = values.Resolve(&r.header_offset, r.header_offset == kMax32, "local header offset")).ok()) return s;
  if (!(s = values.Resolve32(&disk_start, disk_start == kMax16, "disk number")).ok()) return s;
  if (r.flags & kFlagEncrypted) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": encrypted records are not supported"));
  }
  if (method != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unsupported compression method ", method, " (only stored, 0, is supported)"));
  }
  if (disk_start != 0) return MultiDiskError(where);
  if (csize != usize) {
    return absl::DataLossError(
        absl::StrCat(where, ": stored record has compressed size ", csize, " != uncompressed size ", usize));
  }
  r.size = usize;
  *entry_size = kCentralHeaderSize + var_len;
  return absl::OkStatus();
}

// Finds the end of a record's data descriptor, which follows its data at
// `data_end`: an optional signature, the CRC, then 32-bit sizes, or 64-bit
// ones when the local header carries a zip64 field (miniz's rule; the other
// width is tried too). It must agree with the central directory.
absl::StatusOr<uint64_t> DataDescriptorEnd(const uint8_t* base, uint64_t data_end, uint64_t cd_offset,
                                           bool local_zip64, const ZipRecord& r, const std::string& where) {
  uint64_t p = data_end;
  if (cd_offset - p >= 4 && Le32(base + p) == kDataDescriptorSig) p += 4;
  const uint64_t avail = cd_offset - p;
  uint64_t len = 0;
  for (int wide = local_zip64 ? 1 : 0, tries = 0; tries < 2; ++tries, wide ^= 1) {
    len = wide ? 20 : 12;
    if (avail < len) continue;
    const uint8_t* d = base + p;
    uint64_t dc = wide ? Le64(d + 4) : Le32(d + 4);
    uint64_t du = wide ? Le64(d + 12) : Le32(d + 8);
    if (Le32(d) == r.crc32 && dc == r.size && du == r.size) return p + len;
  }
  return absl::DataLossError(absl::StrCat(where, ": data descriptor at offset ", data_end,
                                          " is missing or disagrees with the central directory"));
}

// Checks a record's local header against its central directory entry and
// sets its data offset; returns where the record (data descriptor included)
// ends. Everything must lie before the central directory at `cd_offset`.
absl::StatusOr<uint64_t> CheckLocalHeader(const uint8_t* base, uint64_t cd_offset, const std::string& archive,
                                          ZipRecord* record) {
  ZipRecord& r = *record;
  const std::string where = absl::StrCat(archive, ": record '", r.name, "'");
  if (r.header_offset > cd_offset || cd_offset - r.header_offset < kLocalHeaderSize) {
    return absl::DataLossError(absl::StrCat(where, ": local header at offset ", r.header_offset,
                                            " is not before the central directory at offset ", cd_offset));
  }
  const uint8_t* h = base + r.header_offset;
  if (Le32(h) != kLocalHeaderSig) {
    return absl::DataLossError(absl::StrCat(where, ": bad local header signature at offset ", r.header_offset));
  }
  uint16_t flags = Le16(h + 6), method = Le16(h + 8);
  uint32_t crc = Le32(h + 14);
  uint64_t csize = Le32(h + 18), usize = Le32(h + 22);
  uint16_t name_len = Le16(h + 26), extra_len = Le16(h + 28);
  uint64_t data_offset = r.header_offset + kLocalHeaderSize + name_len + extra_len;
  uint64_t data_end;
  if (data_offset > cd_offset || !AddOk(data_offset, r.size, &data_end) || data_end > cd_offset) {
    return absl::DataLossError(absl::StrCat(where, ": data (", r.size, " bytes at offset ", data_offset,
                                            ") extends past the start of the central directory at offset ",
                                            cd_offset));
  }
  if (name_len != r.name.size() || std::memcmp(h + kLocalHeaderSize, r.name.data(), name_len) != 0) {
    return absl::DataLossError(absl::StrCat(where, ": local header names '",
                                            std::string(reinterpret_cast<const char*>(h + kLocalHeaderSize), name_len),
                                            "'"));
  }
  if (method != 0 || (flags & kFlagDataDescriptor) != (r.flags & kFlagDataDescriptor)) {
    return absl::DataLossError(absl::StrCat(where, ": local header (method ", method, ", flags 0x", absl::Hex(flags),
                                            ") disagrees with the central directory (flags 0x", absl::Hex(r.flags), ")"));
  }
  Zip64Field z64;
  absl::Status s = FindZip64Field(h + kLocalHeaderSize + name_len, extra_len, &z64, where);
  if (!s.ok()) return s;
  // With a data descriptor, miniz leaves CRC and sizes 0 here; otherwise
  // they must match the central directory.
  const bool deferred = (flags & kFlagDataDescriptor) && crc == 0 && csize == 0 && usize == 0;
  if (!deferred) {
    Zip64Values values(z64, where);
    if (!(s = values.Resolve(&usize, usize == kMax32, "local uncompressed size")).ok()) return s;
    if (!(s = values.Resolve(&csize, csize == kMax32, "local compressed size")).ok()) return s;
    if (crc != r.crc32 || usize != r.size || csize != r.size) {
      return absl::DataLossError(absl::StrFormat(
          "%s: local header (crc %08x, sizes %d/%d) disagrees with the central directory (crc %08x, size %d)",
          where, crc, csize, usize, r.crc32, r.size));
    }
  }
  uint64_t end = data_end;
  if (flags & kFlagDataDescriptor) {
    absl::StatusOr<uint64_t> descriptor_end = DataDescriptorEnd(base, data_end, cd_offset, z64.present, r, where);
    if (!descriptor_end.ok()) return descriptor_end.status();
    end = *descriptor_end;
  }
  r.data_offset = data_offset;
  return end;
}

// A record's bytes in the archive, local header to data descriptor.
struct RecordExtent {
  uint64_t begin, end;
  size_t index;
};

// Checks that no two records' extents overlap (sorts `extents`).
absl::Status CheckNoOverlap(std::vector<RecordExtent>& extents, const std::vector<ZipRecord>& records,
                            const std::string& archive) {
  std::sort(extents.begin(), extents.end(),
            [](const RecordExtent& a, const RecordExtent& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].begin < extents[i - 1].end) {
      return ArchiveDataLoss(archive, "records '", records[extents[i - 1].index].name, "' and '",
                             records[extents[i].index].name, "' overlap");
    }
  }
  return absl::OkStatus();
}

}  // namespace

// Parses in phases: locate the central directory from the end records, read
// its entries, check each local header against its entry, check that no two
// records overlap.
absl::Status ZipReader::Parse(const ZipReadOptions& options) {
  const uint8_t* base = archive_.data();
  absl::StatusOr<CentralDirectoryExtent> cd = LocateCentralDirectory(base, archive_.size(), name_, options);
  if (!cd.ok()) return cd.status();
  cd_offset_ = cd->offset;

  // Central directory.
  records_.reserve(cd->entries);
  by_name_.reserve(cd->entries);
  uint64_t pos = cd->offset;
  for (uint64_t i = 0; i < cd->entries; ++i) {
    ZipRecord r;
    uint64_t entry_size = 0;
    absl::Status s = ParseCentralEntry(base, pos, cd->end, i, cd->entries, name_, &r, &entry_size);
    if (!s.ok()) return s;
    if (!by_name_.emplace(r.name, records_.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": record '", r.name, "': duplicate record name"));
    }
    records_.push_back(std::move(r));
    pos += entry_size;
  }
  if (pos != cd->end) {
    return ArchiveDataLoss(name_, "central directory has ", cd->end - pos, " bytes after its ", cd->entries,
                           " entries");
  }

  // Local headers, checked against the central directory; record extents.
  std::vector<RecordExtent> extents;
  extents.reserve(records_.size());
  for (size_t i = 0; i < records_.size(); ++i) {
    absl::StatusOr<uint64_t> end = CheckLocalHeader(base, cd->offset, name_, &records_[i]);
    if (!end.ok()) return end.status();
    extents.push_back({records_[i].header_offset, *end, i});
  }
  absl::Status s = CheckNoOverlap(extents, records_, name_);
  if (!s.ok()) return s;
  crc_ok_ = std::shared_ptr<std::atomic<uint8_t>[]>(new std::atomic<uint8_t>[records_.size()]);
  for (size_t i = 0; i < records_.size(); ++i) crc_ok_[i].store(0, std::memory_order_relaxed);
  return absl::OkStatus();
}

const ZipRecord* ZipReader::Find(std::string_view record_name) const {
  auto it = by_name_.find(Sv(record_name));
  return it == by_name_.end() ? nullptr : &records_[it->second];
}

absl::StatusOr<const ZipRecord*> ZipReader::Get(std::string_view record_name) const {
  const ZipRecord* r = Find(record_name);
  if (r == nullptr) {
    return absl::NotFoundError(absl::StrCat(name_, ": no record '", Sv(record_name), "'"));
  }
  return r;
}

absl::StatusOr<absl::Span<const uint8_t>> ZipReader::Read(std::string_view record_name) const {
  absl::StatusOr<const ZipRecord*> r = Get(record_name);
  if (!r.ok()) return r.status();
  absl::Status s = VerifyCrc(**r);
  if (!s.ok()) return s;
  return Data(**r);
}

namespace {

// The CRC-32 of `data` (bytes of a record at archive offset `data_offset`).
uint32_t CrcOf(absl::Span<const uint8_t> data, uint64_t data_offset,
               const std::function<void(uint64_t, uint64_t)>& on_verified) {
  PhaseTimer timer(Phase::kInputReread, static_cast<int64_t>(data.size()));
  uint32_t crc = 0;
  // In pieces, so that a caller can release what was read as it goes; each
  // piece read through a buffer (MappedFile::ReadThrough) rather than through
  // the mapping: on a VM each page of a mapping touched for the first time
  // costs a fault.
  constexpr size_t kPiece = size_t{16} << 20;
  for (size_t pos = 0; pos < data.size(); pos += kPiece) {
    const size_t len = std::min(kPiece, data.size() - pos);
    for (size_t at = 0; at < len; at += MappedFile::kReadThroughBytes) {
      const size_t n = std::min(MappedFile::kReadThroughBytes, len - at);
      const absl::Span<const uint8_t> bytes = MappedFile::ReadThrough(data.subspan(pos + at, n));
      crc = Crc32(crc, bytes.data(), bytes.size());
    }
    if (on_verified) on_verified(data_offset + pos, len);
  }
  return crc;
}

absl::Status CrcVerdict(uint32_t crc, uint32_t stored, const std::string& archive, const std::string& record) {
  if (crc != stored) {
    return absl::DataLossError(
        absl::StrFormat("%s: record '%s': CRC-32 mismatch (stored %08x, computed %08x)", archive, record, stored, crc));
  }
  return absl::OkStatus();
}

// The CRC-32 of a record's bytes against the one the archive stores.
absl::Status CheckRecordCrc(absl::Span<const uint8_t> data, uint64_t data_offset, uint32_t stored,
                            const std::string& archive, const std::string& record,
                            const std::function<void(uint64_t, uint64_t)>& on_verified) {
  return CrcVerdict(CrcOf(data, data_offset, on_verified), stored, archive, record);
}

thread_local DeferredCrcChecks* current_deferred_checks = nullptr;

}  // namespace

absl::Status ZipReader::VerifyCrc(const ZipRecord& record, bool reading) const {
  const size_t index = IndexOf(record);
  std::atomic<uint8_t>& state = crc_ok_[index];
  const uint8_t now = state.load(std::memory_order_acquire);
  if (now == 1) return absl::OkStatus();
  DeferredCrcChecks* deferred = DeferredCrcChecks::Current();
  if (deferred != nullptr && keep_alive_ != nullptr && record.size >= DeferredCrcChecks::kDeferMinBytes) {
    // Queued once; a caller in a deferral scope trusts a queued check to be
    // waited for (DeferredCrcChecks::Wait) before anything is committed.
    uint8_t expected = 0;
    if (state.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) {
      if (reading) {
        // Checked at Wait from the CRCs of the ranges the units read, and
        // what they did not read.
        deferred->coverage().Track(
            Data(record),
            [keep = keep_alive_, offset = record.data_offset, on_verified = on_verified_](
                absl::Span<const uint8_t> gap, uint64_t at) { return CrcOf(gap, offset + at, on_verified); },
            [keep = keep_alive_, flags = crc_ok_, index, stored = record.crc32, archive = name_,
             name = record.name](uint32_t crc) {
              absl::Status s = CrcVerdict(crc, stored, archive, name);
              flags[index].store(s.ok() ? 1 : 3, std::memory_order_release);
              return s;
            },
            name_, record.name, record.crc32);
      } else {
        deferred->Add([keep = keep_alive_, flags = crc_ok_, index, data = Data(record), offset = record.data_offset,
                       stored = record.crc32, archive = name_, name = record.name, on_verified = on_verified_]() {
          absl::Status s = CheckRecordCrc(data, offset, stored, archive, name, on_verified);
          flags[index].store(s.ok() ? 1 : 3, std::memory_order_release);
          return s;
        });
      }
      return absl::OkStatus();
    }
    if (expected == 1 || expected == 2) return absl::OkStatus();
    // A deferred check of it failed: check again here and report it.
  }
  absl::Status s = CheckRecordCrc(Data(record), record.data_offset, record.crc32, name_, record.name, on_verified_);
  if (!s.ok()) return s;
  state.store(1, std::memory_order_release);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// DeferredCrcChecks

struct DeferredCrcChecks::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<absl::Status()>> queue;  // guarded by mu
  bool running = false;                             // a check is being run
  bool stop = false;
  absl::Status first_error;  // guarded by mu
  std::thread worker;
  int wait_threads = 1;
  ReadCoverage coverage;
  bool pool = false;                  // PoolReads
  std::vector<RecordReads> pooled;    // TakePooledReads
  PhaseTimes* times = PhaseTimes::Current();  // the creator's (--timings)

  void Run() {
    PhaseScope scope(times);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, nothing left
      std::function<absl::Status()> check = std::move(queue.front());
      queue.pop_front();
      running = true;
      lock.unlock();
      absl::Status s = check();
      lock.lock();
      running = false;
      if (!s.ok() && first_error.ok()) first_error = s;
      cv.notify_all();
    }
  }
};

DeferredCrcChecks::DeferredCrcChecks(int wait_threads) : state_(std::make_shared<State>()) {
  state_->wait_threads = wait_threads;
}

ReadCoverage& DeferredCrcChecks::coverage() { return state_->coverage; }

DeferredCrcChecks::~DeferredCrcChecks() {
  (void)Wait();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->worker.joinable()) state_->worker.join();
}

void DeferredCrcChecks::Add(std::function<absl::Status()> check) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->queue.push_back(std::move(check));
  if (!state_->worker.joinable()) {
    State* st = state_.get();
    state_->worker = std::thread([st] { st->Run(); });
  }
  state_->cv.notify_all();
}

void DeferredCrcChecks::PoolReads() { state_->pool = true; }

bool DeferredCrcChecks::PoolsReads() {
  DeferredCrcChecks* c = Current();
  return c != nullptr && c->state_->pool;
}

std::vector<RecordReads> DeferredCrcChecks::TakePooledReads() { return std::move(state_->pooled); }

absl::Status DeferredCrcChecks::Wait() {
  absl::Status tracked;
  if (state_->pool) {
    std::vector<RecordReads> reads = state_->coverage.TakeReads(state_->wait_threads, &tracked);
    for (RecordReads& r : reads) state_->pooled.push_back(std::move(r));
  } else {
    tracked = state_->coverage.CheckAll(state_->wait_threads);
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->queue.empty() && !state_->running; });
  if (!tracked.ok() && state_->first_error.ok()) state_->first_error = tracked;
  return state_->first_error;
}

DeferredCrcChecks* DeferredCrcChecks::Current() { return current_deferred_checks; }

DeferredCrcChecks::Scope::Scope(DeferredCrcChecks* checks)
    : previous_(current_deferred_checks), coverage_(checks != nullptr ? &checks->coverage() : nullptr) {
  current_deferred_checks = checks;
}

DeferredCrcChecks::Scope::~Scope() { current_deferred_checks = previous_; }

absl::Status ZipReader::VerifyAllCrcs() const {
  for (const ZipRecord& r : records_) {
    absl::Status s = VerifyCrc(r);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Sinks


FdSink::FdSink(int fd, std::string path_for_messages, size_t buffer_size, bool writeback)
    : fd_(fd), path_(std::move(path_for_messages)), capacity_(std::max<size_t>(buffer_size, 1)), writeback_(writeback) {}

absl::Status FdSink::WriteAll(const uint8_t* p, size_t n) {
  PhaseTimer timer(Phase::kWrite, static_cast<int64_t>(n));
  while (n > 0) {
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path_, ": write failed"));
    }
    p += w;
    n -= static_cast<size_t>(w);
    pos_ += static_cast<uint64_t>(w);
  }
  if (writeback_ && pos_ >= written_back_ + kWritebackBytes) {
    StartWriteback(fd_, path_, written_back_, pos_ - written_back_);
    written_back_ = pos_;
  }
  return absl::OkStatus();
}

absl::Status FdSink::Write(absl::Span<const uint8_t> bytes) {
  // Pieces of a quarter of the buffer or more are not worth a copy.
  const bool large = bytes.size() >= capacity_ / 4 && !bytes.empty();
  if (!large && buffer_ == nullptr) buffer_.reset(new uint8_t[capacity_]);  // uninitialized
  if (!large && used_ + bytes.size() <= capacity_) {
    std::memcpy(buffer_.get() + used_, bytes.data(), bytes.size());
    used_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status s = Flush();
  if (!s.ok()) return s;
  if (!large) {
    std::memcpy(buffer_.get(), bytes.data(), bytes.size());
    used_ = bytes.size();
    return absl::OkStatus();
  }
  return WriteAll(bytes.data(), bytes.size());
}

absl::Status FdSink::Skip(uint64_t n) {
  absl::Status s = Flush();
  if (!s.ok()) return s;
  if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path_, ": seek failed"));
  }
  pos_ += n;  // those bytes are written (and written back) by whoever skipped them
  written_back_ = pos_;
  return absl::OkStatus();
}

absl::Status FdSink::Flush() {
  if (used_ == 0) return absl::OkStatus();
  absl::Status s = WriteAll(buffer_.get(), used_);
  used_ = 0;
  return s;
}

// ---------------------------------------------------------------------------
// ZipWriter

ZipWriter::ZipWriter(ZipSink* sink, std::string name, ZipWriterOptions options)
    : sink_(sink), name_(std::move(name)), options_(options) {}

absl::Status ZipWriter::Fail(absl::Status status) {
  if (status_.ok()) status_ = status;
  return status;
}

absl::Status ZipWriter::Emit(absl::Span<const uint8_t> bytes) {
  absl::Status s = sink_->Write(bytes);
  if (!s.ok()) return Fail(s);
  offset_ += bytes.size();
  return absl::OkStatus();
}

absl::Status ZipWriter::BeginRecord(std::string_view record_name, uint64_t size) {
  if (!status_.ok()) return status_;
  if (in_record_ || finished_) {
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": BeginRecord('", Sv(record_name), "') while a record is open or after Finish"));
  }
  if (record_name.empty() || record_name.size() > kMax16 || record_name.front() == '/' ||
      record_name.find_first_of(std::string_view("\\:\0", 3)) != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": invalid record name '", Sv(record_name), "'"));
  }
  if (!names_.insert(std::string(record_name)).second) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": duplicate record name '", Sv(record_name), "'"));
  }
  const uint64_t header_offset = offset_;
  const bool zip64_size = Zip64Size(size), zip64_offset = Zip64Offset(header_offset);
  std::string zip64_extra;
  if (zip64_size || zip64_offset) {
    Put16(zip64_extra, kZip64ExtraId);
    Put16(zip64_extra, static_cast<uint16_t>((zip64_size ? 16 : 0) + (zip64_offset ? 8 : 0)));
    if (zip64_size) {
      // miniz fills the local field before it knows the compressed size:
      // uncompressed = size, compressed = 0 (the central one has both).
      Put64(zip64_extra, size);
      Put64(zip64_extra, 0);
    }
    if (zip64_offset) Put64(zip64_extra, header_offset);
  }
  // torch's getPadding: data starts at the next multiple of 64 after the
  // header, the name, the zip64 field and the 4-byte `FB` field header.
  const uint64_t start = header_offset + kLocalHeaderSize + record_name.size() + zip64_extra.size() + 4;
  const uint64_t padding = (kDataAlignment - start % kDataAlignment) % kDataAlignment;

  std::string header;
  header.reserve(kLocalHeaderSize + record_name.size() + zip64_extra.size() + 4 + padding);
  Put32(header, kLocalHeaderSig);
  Put16(header, 0);  // version needed (miniz: 0 for stored)
  Put16(header, size > 0 ? (kFlagDataDescriptor | kFlagUtf8) : kFlagUtf8);
  Put16(header, 0);  // method: stored
  Put16(header, 0);  // DOS time
  Put16(header, 0);  // DOS date
  Put32(header, 0);  // CRC (in the data descriptor)
  Put32(header, 0);  // compressed size
  Put32(header, 0);  // uncompressed size
  Put16(header, static_cast<uint16_t>(record_name.size()));
  Put16(header, static_cast<uint16_t>(zip64_extra.size() + 4 + padding));
  header.append(record_name.data(), record_name.size());
  header.append(zip64_extra);
  header.append("FB");
  Put16(header, static_cast<uint16_t>(padding));
  header.append(padding, 'Z');
  absl::Status s = Emit(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(header.data()), header.size()));
  if (!s.ok()) return s;
  entries_.push_back({std::string(record_name), header_offset, size, 0});
  in_record_ = true;
  record_written_ = 0;
  record_crc_ = 0;
  return absl::OkStatus();
}

absl::Status ZipWriter::WriteData(absl::Span<const uint8_t> chunk) {
  if (!status_.ok()) return status_;
  if (!in_record_) return absl::FailedPreconditionError(absl::StrCat(name_, ": WriteData with no open record"));
  const Entry& entry = entries_.back();
  if (chunk.size() > entry.size - record_written_) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(name_, ": record '", entry.name, "' declared ", entry.size,
                                                           " bytes, got more")));
  }
  {
    PhaseTimer timer(Phase::kOutputCrc, static_cast<int64_t>(chunk.size()));
    const uint32_t crc = Crc32(0, chunk.data(), chunk.size());
    record_crc_ = Crc32Combine(record_crc_, crc, chunk.size());
    // When these are bytes of an input record checked from what is read
    // (DeferredCrcChecks), this is their check.
    ReadCoverage::NoteRead(chunk.data(), chunk.size(), crc);
  }
  record_written_ += chunk.size();
  return Emit(chunk);
}

absl::Status ZipWriter::SkipData(uint32_t crc) {
  if (!status_.ok()) return status_;
  if (!in_record_ || record_written_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": SkipData needs a freshly begun record"));
  }
  const uint64_t n = entries_.back().size;
  absl::Status s = sink_->Skip(n);
  if (!s.ok()) return Fail(s);
  offset_ += n;
  record_written_ = n;
  record_crc_ = crc;
  return absl::OkStatus();
}

absl::Status ZipWriter::EndRecord() {
  if (!status_.ok()) return status_;
  if (!in_record_) return absl::FailedPreconditionError(absl::StrCat(name_, ": EndRecord with no open record"));
  Entry& entry = entries_.back();
  if (record_written_ != entry.size) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(name_, ": record '", entry.name, "' declared ", entry.size,
                                                           " bytes, got ", record_written_)));
  }
  entry.crc32 = record_crc_;
  in_record_ = false;
  if (entry.size == 0) return absl::OkStatus();  // miniz writes no descriptor
  std::string descriptor;
  Put32(descriptor, kDataDescriptorSig);
  Put32(descriptor, entry.crc32);
  if (Zip64Size(entry.size) || Zip64Offset(entry.header_offset)) {
    Put64(descriptor, entry.size);
    Put64(descriptor, entry.size);
  } else {
    Put32(descriptor, static_cast<uint32_t>(entry.size));
    Put32(descriptor, static_cast<uint32_t>(entry.size));
  }
  return Emit(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(descriptor.data()), descriptor.size()));
}

absl::Status ZipWriter::AddRecord(std::string_view record_name, absl::Span<const uint8_t> data) {
  absl::Status s = BeginRecord(record_name, data.size());
  if (s.ok()) s = WriteData(data);
  if (s.ok()) s = EndRecord();
  return s;
}

absl::Status ZipWriter::Finish() {
  if (!status_.ok()) return status_;
  if (in_record_ || finished_) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": Finish while a record is open or twice"));
  }
  const uint64_t cd_offset = offset_;
  std::string cd;
  for (const Entry& entry : entries_) {
    const bool zip64_size = Zip64Size(entry.size), zip64_offset = Zip64Offset(entry.header_offset);
    std::string zip64_extra;
    if (zip64_size || zip64_offset) {
      Put16(zip64_extra, kZip64ExtraId);
      Put16(zip64_extra, static_cast<uint16_t>((zip64_size ? 16 : 0) + (zip64_offset ? 8 : 0)));
      if (zip64_size) {
        Put64(zip64_extra, entry.size);
        Put64(zip64_extra, entry.size);
      }
      if (zip64_offset) Put64(zip64_extra, entry.header_offset);
    }
    Put32(cd, kCentralHeaderSig);
    Put16(cd, 0);  // version made by
    Put16(cd, 0);  // version needed
    Put16(cd, entry.size > 0 ? (kFlagDataDescriptor | kFlagUtf8) : kFlagUtf8);
    Put16(cd, 0);  // method
    Put16(cd, 0);  // time
    Put16(cd, 0);  // date
    Put32(cd, entry.crc32);
    Put32(cd, zip64_size ? static_cast<uint32_t>(kMax32) : static_cast<uint32_t>(entry.size));
    Put32(cd, zip64_size ? static_cast<uint32_t>(kMax32) : static_cast<uint32_t>(entry.size));
    Put16(cd, static_cast<uint16_t>(entry.name.size()));
    Put16(cd, static_cast<uint16_t>(zip64_extra.size()));
    Put16(cd, 0);  // comment length
    Put16(cd, 0);  // disk number start
    Put16(cd, 0);  // internal attributes
    Put32(cd, 0);  // external attributes
    Put32(cd, zip64_offset ? static_cast<uint32_t>(kMax32) : static_cast<uint32_t>(entry.header_offset));
    cd.append(entry.name);
    cd.append(zip64_extra);
  }
  const uint64_t cd_size = cd.size();
  const uint64_t z64_offset = cd_offset + cd_size;
  const uint64_t n = entries_.size();
  // Zip64 end of central directory record (torch always writes it).
  Put32(cd, kZip64EndOfCentralDirSig);
  Put64(cd, kZip64EndOfCentralDirSize - 12);
  Put16(cd, 0x031E);  // made by
  Put16(cd, 0x002D);  // needed: 4.5
  Put32(cd, 0);
  Put32(cd, 0);
  Put64(cd, n);
  Put64(cd, n);
  Put64(cd, cd_size);
  Put64(cd, cd_offset);
  // Locator.
  Put32(cd, kZip64LocatorSig);
  Put32(cd, 0);
  Put64(cd, z64_offset);
  Put32(cd, 1);
  // Classic end of central directory record.
  Put32(cd, kEndOfCentralDirSig);
  Put16(cd, 0);
  Put16(cd, 0);
  Put16(cd, static_cast<uint16_t>(std::min<uint64_t>(n, kMax16)));
  Put16(cd, static_cast<uint16_t>(std::min<uint64_t>(n, kMax16)));
  Put32(cd, Zip64Size(cd_size) ? static_cast<uint32_t>(kMax32) : static_cast<uint32_t>(cd_size));
  Put32(cd, Zip64Offset(cd_offset) ? static_cast<uint32_t>(kMax32) : static_cast<uint32_t>(cd_offset));
  Put16(cd, 0);  // comment length
  absl::Status s = Emit(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(cd.data()), cd.size()));
  if (!s.ok()) return s;
  s = sink_->Flush();
  if (!s.ok()) return Fail(s);
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace ucp::torch
