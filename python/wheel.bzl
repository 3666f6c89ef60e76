"""The wheels of `import ucp`: one per Python (the host's 3.11, and the Pythons of
the Debian roots trixie and sid, third_party/portable.bzl's debian_python), each
self-contained: its extension module linked as the `ucp` binary is (Abseil,
protobuf, xxhash, libstdc++ inside; the oldest Debian root's glibc), the `ucp`
binary inside for the `ucp` command, and the manylinux platform tag their symbol
versions allow (tools/elf_abi.py, as auditwheel would judge them).

ucp_wheel(name, python, ...) defines, when `python` and Debian's sources are there:
  NAME_core_lib  ucp_module.cc against that Python's headers and pybind11
  NAME_core.so   the extension module (portable_shared_library)
  NAME           a folder holding ucp-VERSION-cpXY-cpXY-PLATFORM.whl (the platform tag
                 is known only once the module is linked, hence a folder)
and nothing when they are missing: wheel_missing() then says why.
"""

load("@debian_pic_sources//:defs.bzl", "PIC_SOURCES")
load("//third_party:portable_defs.bzl", "portable_shared_library")
load("//tools:version.bzl", "UCP_VERSION")

def wheel_missing(python):
    """Why the wheel of `python` cannot be built here, or ""."""
    if not python.available:
        return python.missing
    if not PIC_SOURCES.available:
        return PIC_SOURCES.missing
    return ""

def _wheel_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    args = ctx.actions.args()
    args.add(ctx.file._build_wheel)
    args.add("--out-dir", out.path)
    args.add("--version", UCP_VERSION)
    args.add("--python-tag", ctx.attr.python_tag)
    args.add("--elf-abi", ctx.file._elf_abi)
    args.add("--readme", ctx.file.readme)
    args.add("--binary", ctx.file.binary)
    args.add("--strip")
    args.add(ctx.file.extension)
    args.add_all(ctx.files.srcs)
    ctx.actions.run(
        executable = "/usr/bin/python3",
        arguments = [args],
        inputs = ctx.files.srcs + [ctx.file.extension, ctx.file.binary, ctx.file.readme,
                                   ctx.file._build_wheel, ctx.file._elf_abi],
        outputs = [out],
        mnemonic = "UcpWheel",
        progress_message = "Building the %s wheel" % ctx.attr.python_tag,
        use_default_shell_env = True,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

_wheel = rule(
    implementation = _wheel_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".py"]),
        "extension": attr.label(allow_single_file = True, mandatory = True),
        "binary": attr.label(allow_single_file = True, mandatory = True),
        "readme": attr.label(allow_single_file = True, mandatory = True),
        "python_tag": attr.string(mandatory = True),
        "_build_wheel": attr.label(default = "//python:build_wheel.py", allow_single_file = True),
        "_elf_abi": attr.label(default = "//tools:elf_abi.py", allow_single_file = True),
    },
)

def ucp_wheel(name, python, srcs, module_src, module_deps, version_script, binary, readme):
    if wheel_missing(python):
        return
    native.cc_library(
        name = name + "_core_lib",
        srcs = [module_src],
        copts = ["-fvisibility=hidden"],
        deps = module_deps + [python.headers],
        # PyInit__core is what Python looks for; nothing in the link refers to it.
        alwayslink = 1,
    )
    portable_shared_library(
        name = name + "_core.so",
        shared = True,
        version_script = version_script,
        deps = [
            ":" + name + "_core_lib",
            # Debian's archive members that a shared object cannot hold, -fPIC.
            "@debian_pic_sources//:absl_pic",
            "@debian_pic_sources//:protobuf_pic",
        ],
    )
    _wheel(
        name = name,
        srcs = srcs,
        extension = ":" + name + "_core.so",
        binary = binary,
        readme = readme,
        python_tag = python.tag,
    )
