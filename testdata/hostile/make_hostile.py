"""Writes the hostile corpus: one small file per case and, beside it,
`<file>.expect` saying which reader must read it and what it must say.

Run from anywhere with Debian's /usr/bin/python3 (standard library only):

    /usr/bin/python3 testdata/hostile/make_hostile.py

Every byte is built here by hand (struct, zlib.crc32): no torch, no pickle
module, so each file is exactly the damage it is named for. The generated
files (and README.md, which lists the cases) are committed;
//fuzz:hostile_corpus_test reads them, and tools/fuzz.sh feeds them to the
fuzzers as a corpus.

`.expect` format, one `key: value` per line (`#` starts a comment):
  reader:   pickle      ucp::pickle::Unpickle on the bytes
            torch_file  ucp::torch::TorchFile::Open on the file, and
                        TorchFile::FromBytes on its bytes (both must agree)
  code:     an absl::StatusCode name as absl::StatusCodeToString spells it
            (DATA_LOSS, INVALID_ARGUMENT, OUT_OF_RANGE, RESOURCE_EXHAUSTED,
            UNIMPLEMENTED, ...) or OK
  message:  a substring the status message must contain (not for OK)
  root_object:         (OK only) the root must be an Object of this
                       `module.name` global: data, never called
  get_tensor_code:     (torch_file, OK only) what TorchFile::GetTensor says
  get_tensor_message:  of the root
  must_not_exist:      a path that a load executing the pickle would create
"""

import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------
# Pickle opcodes (protocol 2 unless a case says otherwise).

PROTO2 = b"\x80\x02"
STOP = b"."
MARK = b"("
TUPLE = b"t"
TUPLE1 = b"\x85"
REDUCE = b"R"
NEWFALSE = b"\x89"
EMPTY_DICT = b"}"
EMPTY_LIST = b"]"
EMPTY_TUPLE = b")"
SETITEM = b"s"
SETITEMS = b"u"
APPEND = b"a"
DUP = b"2"
BINPERSID = b"Q"
NONE = b"N"


def binunicode(s):
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def integer(n):
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    length = (n.bit_length() + 8) // 8  # room for the sign bit
    return b"\x8a" + bytes([length]) + n.to_bytes(length, "little", signed=True)


def global_(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tuple_(*items):
    return MARK + b"".join(items) + TUPLE


def binput(i):
    return b"q" + bytes([i])


def binget(i):
    return b"h" + bytes([i])


def persistent_id(storage_class="FloatStorage", key="0", numel=4):
    return tuple_(binunicode("storage"), global_("torch", storage_class), binunicode(key), binunicode("cpu"),
                  integer(numel)) + BINPERSID


def rebuild_tensor(storage, offset=0, size=(4,), stride=(1,)):
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""
    return (global_("torch._utils", "_rebuild_tensor_v2") +
            tuple_(storage, integer(offset), tuple_(*map(integer, size)), tuple_(*map(integer, stride)), NEWFALSE,
                   global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE) + REDUCE)


def state_dict(**entries):
    """{'name': value, ...} (a plain dict, as torch.save of a dict writes)."""
    body = b"".join(binunicode(k) + v for k, v in entries.items())
    return EMPTY_DICT + MARK + body + SETITEMS


def pickle2(body):
    return PROTO2 + body + STOP


OS_SYSTEM_MARKER = "/tmp/ucp_hostile_os_system_ran"
OS_SYSTEM_CALL = global_("os", "system") + binunicode("touch " + OS_SYSTEM_MARKER) + TUPLE1 + REDUCE

# ---------------------------------------------------------------------------
# Zip (stored records, no data descriptors), as zip.h reads it.


def zip_archive(records, central=None, local=None):
    """`records`: [(name, data)]. `central`: {index: dict of central directory
    overrides: method, crc, size (written in both size fields), extra};
    `local`: {index: dict of local header overrides: crc, size}."""
    central = central or {}
    local = local or {}
    out = b""
    entries = []
    for i, (name, data) in enumerate(records):
        n = name.encode()
        crc = zlib.crc32(data) & 0xFFFFFFFF
        offset = len(out)
        lo = local.get(i, {})
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, lo.get("crc", crc), lo.get("size", len(data)),
                           lo.get("size", len(data)), len(n), 0)
        out += n + data
        o = central.get(i, {})
        entries.append((n, o.get("method", 0), o.get("crc", crc), o.get("size", len(data)), o.get("extra", b""),
                        offset))
    cd_offset = len(out)
    for n, method, crc, size, extra, offset in entries:
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, size, size, len(n),
                           len(extra), 0, 0, 0, 0, offset)
        out += n + extra
    cd_size = len(out) - cd_offset
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), cd_size, cd_offset, 0)
    return out


def torch_archive(pkl, storages=(("0", b"\x00" * 16),), extra_records=(), central=None):
    records = [("archive/data.pkl", pkl)]
    records += [("archive/data/" + key, data) for key, data in storages]
    records += list(extra_records)
    records.append(("archive/version", b"3\n"))
    return zip_archive(records, central)


FLOATS4 = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
GOOD_PKL = pickle2(state_dict(weight=rebuild_tensor(persistent_id())))
GOOD_PT = torch_archive(GOOD_PKL, storages=(("0", FLOATS4),))

# ---------------------------------------------------------------------------
# The cases: (file name, bytes, expectation lines). Comments say what the
# file is and why the reader must answer that way.

CASES = []


def case(name, data, comment, **expect):
    CASES.append((name, data, comment, expect))


# ---- archives: TorchFile::Open / FromBytes ----

case("truncated_zip.pt", GOOD_PT[: len(GOOD_PT) // 2],
     "A valid torch.save-like archive cut in half: the end of central directory record is gone.",
     reader="torch_file", code="DATA_LOSS", message="no end of central directory record")

bad_crc = bytearray(GOOD_PT)
bad_crc[GOOD_PT.index(FLOATS4) + 5] ^= 0x01  # one bit of the storage bytes; the stored CRC is unchanged
case("bad_crc.pt", bytes(bad_crc),
     "One bit of storage archive/data/0 flipped after the CRC-32 was recorded.",
     reader="torch_file", code="DATA_LOSS", message="record 'archive/data/0': CRC-32 mismatch")

case("duplicate_record.pt",
     torch_archive(GOOD_PKL, storages=(("0", FLOATS4), ("0", b"\x00" * 16))),
     "Two records named archive/data/0: which one a reader picks would be arbitrary.",
     reader="torch_file", code="INVALID_ARGUMENT", message="record 'archive/data/0': duplicate record name")

# The central directory saturates both 32-bit sizes and its zip64 extra field
# (0x0001, 16 bytes: uncompressed then compressed size) says 2^62 bytes.
zip64_extra = struct.pack("<HHQQ", 0x0001, 16, 2**62, 2**62)
case("zip64_impossible_size.pt",
     torch_archive(GOOD_PKL, storages=(("0", FLOATS4),), central={1: {"size": 0xFFFFFFFF, "extra": zip64_extra}}),
     "A zip64 record (archive/data/0) whose size is 2^62 bytes in a file of a few hundred.",
     reader="torch_file", code="DATA_LOSS",
     message="record 'archive/data/0': data (4611686018427387904 bytes at offset")

case("compressed_record.pt",
     torch_archive(GOOD_PKL, storages=(("0", FLOATS4),), central={1: {"method": 8}}),
     "archive/data/0 claims deflate compression: torch only writes stored records, and a storage must be "
     "addressable in place.",
     reader="torch_file", code="INVALID_ARGUMENT", message="unsupported compression method 8")

case("view_past_storage.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(numel=4), size=(5,), stride=(1,)))),
                   storages=(("0", FLOATS4),)),
     "A float32 view of 5 elements on a storage of 4.",
     reader="torch_file", code="OUT_OF_RANGE",
     message="tensor view offset 0 size [5] stride [1] reaches element 4 of a float32 storage of 4 elements")

case("view_offset_past_storage.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(numel=4), offset=3, size=(2,),
                                                            stride=(1,)))),
                   storages=(("0", FLOATS4),)),
     "A float32 view [3, 5) of a storage of 4 elements: in range at its start, past the end at its last element.",
     reader="torch_file", code="OUT_OF_RANGE",
     message="tensor view offset 3 size [2] stride [1] reaches element 4 of a float32 storage of 4 elements")

case("view_extent_overflow.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(numel=4), offset=2**62, size=(3,),
                                                            stride=(2**62,)))),
                   storages=(("0", FLOATS4),)),
     "Offset 2^62 plus 2 * stride 2^62: the last element's index overflows int64 (checked arithmetic).",
     reader="torch_file", code="OUT_OF_RANGE", message="overflows")

case("storage_record_too_short.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(numel=8), size=(8,), stride=(1,)))),
                   storages=(("0", FLOATS4),)),
     "The persistent id says 8 float32 elements (32 bytes); the record holds 16 bytes.",
     reader="torch_file", code="DATA_LOSS",
     message="record 'archive/data/0' holds 16 bytes, but its persistent id says 8 float32 elements")

case("storage_record_missing.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(key="7")))), storages=(("0", FLOATS4),)),
     "The persistent id names storage '7'; the archive has no archive/data/7.",
     reader="torch_file", code="DATA_LOSS", message="storage '7' has no record 'archive/data/7'")

case("unknown_storage_class.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(storage_class="EvilStorage")))),
                   storages=(("0", FLOATS4),)),
     "A persistent id with storage class torch.EvilStorage: no dtype, so no element size.",
     reader="torch_file", code="INVALID_ARGUMENT", message="unknown torch storage class 'EvilStorage'")

case("storage_dtype_conflict.pt",
     torch_archive(pickle2(state_dict(a=rebuild_tensor(persistent_id()),
                                      b=rebuild_tensor(persistent_id(storage_class="IntStorage")))),
                   storages=(("0", FLOATS4),)),
     "Two persistent ids give storage '0' different dtypes (float32 and int32).",
     reader="torch_file", code="INVALID_ARGUMENT", message="storage '0' is used as float32[4] and as int32[4]")

case("negative_stride.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(), offset=3, size=(4,), stride=(-1,)))),
                   storages=(("0", FLOATS4),)),
     "A reversed view (stride -1 from offset 3): torch cannot make one; its extent would run backwards.",
     reader="torch_file", code="INVALID_ARGUMENT", message="stride [-1] has a negative entry")

case("numel_times_itemsize_overflow.pt",
     torch_archive(pickle2(state_dict(weight=rebuild_tensor(persistent_id(), size=(2**61,), stride=(0,)))),
                   storages=(("0", FLOATS4),)),
     "2^61 float32 elements (stride 0, so every element is inside the storage): numel fits int64, "
     "numel x 4 bytes does not.",
     reader="torch_file", code="OUT_OF_RANGE", message="tensor of size [2305843009213693952] has too many elements")

case("unknown_opcode_in_archive.pt",
     torch_archive(PROTO2 + b"\xff" + STOP, storages=()),
     "data.pkl holds an unknown opcode: the pickle error carries the record name and the byte offset.",
     reader="torch_file", code="INVALID_ARGUMENT", message="archive/data.pkl: pickle: at byte 2 (0xff): unknown opcode 0xff")

case("os_system_archive.pt",
     torch_archive(pickle2(OS_SYSTEM_CALL), storages=()),
     "data.pkl is os.system('touch " + OS_SYSTEM_MARKER + "') via REDUCE. Decision: the file loads, as data: "
     "the root is an Object of the global os.system, which nothing resolves or calls, and it is not a tensor.",
     reader="torch_file", code="OK", root_object="os.system", get_tensor_code="INVALID_ARGUMENT",
     get_tensor_message="not a tensor", must_not_exist=OS_SYSTEM_MARKER)

case("os_system_as_storage.pt",
     torch_archive(pickle2(state_dict(weight=(global_("torch._utils", "_rebuild_tensor_v2") +
                                              tuple_(OS_SYSTEM_CALL, integer(0), tuple_(integer(4)),
                                                     tuple_(integer(1)), NEWFALSE,
                                                     global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE) +
                                              REDUCE))),
                   storages=(("0", FLOATS4),)),
     "A tensor whose storage is the result of os.system(...) instead of a persistent id: refused as a tensor.",
     reader="torch_file", code="INVALID_ARGUMENT", message="_rebuild_tensor_v2's storage is not a persistent id",
     must_not_exist=OS_SYSTEM_MARKER)

# Record archive/data/0 claims more bytes than it has: its data runs over the
# local header of archive/version. CRCs and both headers agree with that
# size, so only the overlap check can tell.
overlap_records = [("archive/data.pkl", GOOD_PKL), ("archive/data/0", FLOATS4), ("archive/version", b"3\n")]
plain = zip_archive(overlap_records)
data0_start = plain.index(FLOATS4)
swallowed = plain[data0_start:plain.index(b"PK\x03\x04", data0_start) + 16]
claim = {"crc": zlib.crc32(swallowed) & 0xFFFFFFFF, "size": len(swallowed)}
overlap = zip_archive(overlap_records, central={1: claim}, local={1: claim})
assert overlap[data0_start:data0_start + len(swallowed)] == swallowed
case("overlapping_records.pt", bytes(overlap),
     "archive/data/0's data runs over the local header of archive/version (a storage aliasing other records).",
     reader="torch_file", code="DATA_LOSS", message="records 'archive/data/0' and 'archive/version' overlap")

# ---- pickles: Unpickle ----

case("unknown_opcode.pkl", PROTO2 + b"\xff" + STOP,
     "0xff is no pickle opcode.",
     reader="pickle", code="INVALID_ARGUMENT", message="pickle: at byte 2 (0xff): unknown opcode 0xff")

case("str_length_past_end.pkl", PROTO2 + b"X" + struct.pack("<I", 0x7FFFFFFF) + b"abc",
     "BINUNICODE announces 2^31 - 1 bytes; 3 follow. Nothing may be allocated for the announced length.",
     reader="pickle", code="DATA_LOSS", message="(BINUNICODE): operand of 2147483647 bytes but only 3 are left")

case("bytes_length_past_end.pkl", b"\x80\x04" + b"\x8e" + struct.pack("<Q", 2**63) + b"ab",
     "BINBYTES8 announces 2^63 bytes; 2 follow.",
     reader="pickle", code="DATA_LOSS",
     message="(BINBYTES8): operand of 9223372036854775808 bytes but only 2 are left")

case("negative_binstring_length.pkl", PROTO2 + b"T" + struct.pack("<i", -1) + b"abc",
     "BINSTRING with a negative length (CPython refuses it the same way).",
     reader="pickle", code="INVALID_ARGUMENT", message="(BINSTRING): negative byte count -1")

case("truncated_binint.pkl", PROTO2 + b"J\x01\x02",
     "BININT needs 4 bytes; 2 are left.",
     reader="pickle", code="DATA_LOSS", message="(BININT): truncated: needs 4 bytes but only 2 are left")

case("frame_past_end.pkl", b"\x80\x04\x95" + struct.pack("<Q", 1000) + NONE + STOP,
     "A protocol 4 FRAME of 1000 bytes with 2 left.",
     reader="pickle", code="DATA_LOSS", message="(FRAME): frame of 1000 bytes but only 2 are left")

case("no_stop.pkl", PROTO2 + NONE,
     "The stream ends without STOP.",
     reader="pickle", code="INVALID_ARGUMENT", message="the pickle ended without STOP")

case("binget_undefined.pkl", PROTO2 + binget(9) + STOP,
     "BINGET of memo key 9, which no PUT defined.",
     reader="pickle", code="INVALID_ARGUMENT", message="(BINGET): memo key 9 is not defined")

case("memo_key_huge.pkl", PROTO2 + NONE + b"r" + struct.pack("<I", 0xFFFFFFFF) + STOP,
     "LONG_BINPUT at key 2^32 - 1: past the memo cap, so no table of that size is made.",
     reader="pickle", code="RESOURCE_EXHAUSTED", message="(LONG_BINPUT): memo key 4294967295 beyond max_memo_entries")

case("stack_underflow.pkl", PROTO2 + REDUCE + STOP,
     "REDUCE on an empty stack.",
     reader="pickle", code="INVALID_ARGUMENT", message="(REDUCE): stack underflow: needs 2 values, has 0")

case("os_system_reduce.pkl", pickle2(OS_SYSTEM_CALL),
     "os.system('touch " + OS_SYSTEM_MARKER + "') via GLOBAL + REDUCE: read as data, an Object of the global "
     "os.system with its argument tuple; nothing is imported or called.",
     reader="pickle", code="OK", root_object="os.system", must_not_exist=OS_SYSTEM_MARKER)

case("os_system_stack_global.pkl",
     b"\x80\x04" + b"\x8c\x05posix" + b"\x8c\x06system" + b"\x93" + b"\x8c\x04true" + TUPLE1 + REDUCE + STOP,
     "posix.system('true') the way protocol 4 pickles os.system (STACK_GLOBAL): data too.",
     reader="pickle", code="OK", root_object="posix.system")

case("self_reference_dup_append.pkl", pickle2(EMPTY_LIST + DUP + APPEND),
     "A list appended to itself through DUP (Python's l = []; l.append(l)).",
     reader="pickle", code="INVALID_ARGUMENT", message="(APPEND): self-referencing structure: a list would contain itself")

case("self_reference_memo_get.pkl", pickle2(EMPTY_LIST + binput(0) + binget(0) + APPEND),
     "A list appended to itself through the memo (BINPUT 0, BINGET 0, APPEND).",
     reader="pickle", code="INVALID_ARGUMENT", message="(APPEND): self-referencing structure: a list would contain itself")

case("self_reference_indirect.pkl",
     pickle2(EMPTY_LIST + binput(0) + EMPTY_LIST + binget(0) + APPEND + APPEND),
     "a = []; b = [a]; a.append(b): a cycle of two lists, closed through the memo.",
     reader="pickle", code="INVALID_ARGUMENT", message="(APPEND): self-referencing structure: a list would contain itself")

case("self_reference_dict.pkl",
     pickle2(EMPTY_DICT + binput(0) + binunicode("self") + binget(0) + SETITEM),
     "d = {}; d['self'] = d through the memo.",
     reader="pickle", code="INVALID_ARGUMENT", message="(SETITEM): self-referencing structure: a dict would contain itself")

case("deep_nesting.pkl", pickle2(EMPTY_LIST * 600 + APPEND * 599),
     "600 lists nested in one another, past the default max_nesting of 512.",
     reader="pickle", code="RESOURCE_EXHAUSTED", message="(APPEND): nesting deeper than max_nesting 512")

case("deep_nesting_tuples.pkl", pickle2(MARK * 600 + TUPLE * 600),
     "600 tuples nested with MARK ... TUPLE, past max_nesting.",
     reader="pickle", code="RESOURCE_EXHAUSTED", message="(TUPLE): nesting deeper than max_nesting 512")

# L1 > L2 > ... > L300 (L300 memoized first), then M1 > ... > M300 appended to
# L300 through the memo: each step is within max_nesting, but L1 ends up 600
# deep. The depth recorded for L1 is stale, so STOP re-measures the tree (POP
# drops the second reference to L300 first).
case("deep_nesting_through_memo.pkl",
     pickle2(EMPTY_LIST * 300 + binput(0) + APPEND * 299 + binget(0) + EMPTY_LIST * 300 + APPEND * 299 + APPEND +
             b"0"),
     "Nesting past max_nesting made by mutating a shared (memoized) inner list after it was nested.",
     reader="pickle", code="RESOURCE_EXHAUSTED", message="nesting deeper than max_nesting 512")

# t = []; a = [65535 distinct empty lists]; then t.append(a) 1025 times with t
# aliased: every append checks that a does not reach t (65536 values), so the
# checks would grow quadratically; max_self_reference_visits (2^26) stops them.
SELF_REFERENCE_CHILDREN = 65535
case("self_reference_check_budget.pkl",
     pickle2(EMPTY_LIST + binput(0) + binget(0) + b"0" + EMPTY_LIST + binput(1) + MARK +
             EMPTY_LIST * SELF_REFERENCE_CHILDREN + b"e" + b"0" + (binget(1) + APPEND) * 1025),
     "Appending a 65536-value list 1025 times to an aliased list: the self-reference checks are bounded.",
     reader="pickle", code="RESOURCE_EXHAUSTED",
     message="(APPEND): self-reference checks visited more than max_self_reference_visits 67108864 values")

case("unhashable_dict_key.pkl", pickle2(EMPTY_DICT + EMPTY_LIST + NONE + SETITEM),
     "A list as a dict key.",
     reader="pickle", code="INVALID_ARGUMENT", message="(SETITEM): unhashable list as dict key")

case("huge_text_int.pkl", PROTO2 + b"I" + b"9" * 5000 + b"\n" + STOP,
     "A protocol 0 INT of 5000 digits (decimal conversion is quadratic; Python's int_max_str_digits is 4300).",
     reader="pickle", code="RESOURCE_EXHAUSTED", message="(INT): integer literal of 5000 digits exceeds max_int_digits 4300")

case("protocol_6.pkl", b"\x80\x06" + NONE + STOP,
     "PROTO 6 does not exist yet.",
     reader="pickle", code="UNIMPLEMENTED", message="(PROTO): unsupported pickle protocol 6")

case("extension_registry.pkl", PROTO2 + b"\x82\x01" + STOP,
     "EXT1 would look up copyreg's extension registry of the loading process.",
     reader="pickle", code="UNIMPLEMENTED", message="(EXT1): the copyreg extension registry is not supported")


README_HEAD = """# Hostile corpus

Files that must not crash, hang or fool the readers, one case per file. Each
`<file>.expect` says which reader reads it and the exact `absl::StatusCode`
and message substring it must give; `//fuzz:hostile_corpus_test` checks them
all (and fails on a file without an expectation), the replay tests
`//fuzz:*_fuzzer_replay_test` run them through the fuzz targets' invariants,
and `tools/fuzz.sh` uses them as a fuzzing corpus.

Generated by `/usr/bin/python3 testdata/hostile/make_hostile.py` (bytes built
by hand, standard library only), which also writes this file. To add a case,
add a `case(...)` there and rerun it; commit the outputs.

## `os.system` and other globals

A pickle that calls `os.system` (GLOBAL or STACK_GLOBAL + REDUCE) is read as
data: an `Object` whose callable is the global `os.system`, with its argument
tuple. Nothing is imported, resolved or called (the test checks that the
file the command would create does not appear). `TorchFile` loads such an
archive too (code OK): the object is not a tensor, `GetTensor` refuses it
with `INVALID_ARGUMENT` ("not a tensor"), and where a tensor's storage should
be a persistent id, an `os.system(...)` object makes the file fail with
`INVALID_ARGUMENT`. Refusing unknown globals outright would also refuse the
checkpoints ucp exists to read (argparse.Namespace, numpy, DeepSpeed enums),
so the rule is: every global is data, and only the tensor/storage shapes
torch writes are interpreted.

## Cases

| file | reader | code | message contains |
|---|---|---|---|
"""


def write_readme():
    rows = []
    for name, _, _, expect in sorted(CASES):
        message = expect.get("message", "root is an Object of " + expect.get("root_object", ""))
        rows.append("| `%s` | %s | %s | %s |" % (name, expect["reader"], expect["code"],
                                               message.replace("|", "\\|")))
    with open(os.path.join(HERE, "README.md"), "w") as f:
        f.write(README_HEAD + "\n".join(rows) + "\n")


def main():
    names = set()
    for name, data, comment, expect in CASES:
        assert name not in names, name
        names.add(name)
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
        lines = ["# " + comment]
        for key in ("reader", "code", "message", "root_object", "get_tensor_code", "get_tensor_message",
                    "must_not_exist"):
            if key in expect:
                lines.append("%s: %s" % (key, expect[key]))
        with open(os.path.join(HERE, name + ".expect"), "w") as f:
            f.write("\n".join(lines) + "\n")
    write_readme()
    print("make_hostile: wrote %d cases to %s" % (len(CASES), HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
