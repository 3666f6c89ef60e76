"""portable_binary and portable_shared_library (third_party/portable.bzl) linked
against the oldest Debian root's glibc when it is there (@glibc_sysroot), else
against the host's: the artifact then needs the host's glibc, which `ucp
--version` and tools/elf_abi.py report, and tools/release.sh refuses."""

load("@glibc_sysroot//:defs.bzl", "SYSROOT")
load(":portable.bzl", _binary = "portable_binary", _shared = "portable_shared_library")

def _sysroot_attrs():
    if SYSROOT.available:
        return {"sysroot_path": SYSROOT.path, "sysroot_files": ["@glibc_sysroot//:files"]}
    return {}

def portable_binary(**kwargs):
    _binary(**dict(kwargs, **_sysroot_attrs()))

def portable_shared_library(**kwargs):
    _shared(**dict(kwargs, **_sysroot_attrs()))
