// The pickle opcodes of protocols 0-5, named as CPython's `Lib/pickletools.py`
// names them, shared by the reader and the writer.
//
// Example:
//   if (byte == internal_opcodes::kBinGet) ...
//   absl::StrCat("(", internal_opcodes::OpcodeName(byte), ")");  // "(BINGET)"
#ifndef UCP_FORMAT_PICKLE_INTERNAL_OPCODES_H_
#define UCP_FORMAT_PICKLE_INTERNAL_OPCODES_H_

#include <cstdint>

namespace ucp::pickle::internal_opcodes {

enum Opcode : uint8_t {
  // protocol 0 and 1
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  // protocol 2
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  // protocol 3
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  // protocol 4
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  // protocol 5
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadonlyBuffer = 0x98,
};

// "BINGET", ...; nullptr for a byte that is no opcode.
const char* OpcodeName(uint8_t opcode);

}  // namespace ucp::pickle::internal_opcodes

#endif  // UCP_FORMAT_PICKLE_INTERNAL_OPCODES_H_
