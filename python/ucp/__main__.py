"""`python3 -m ucp ds_to_universal ...`: a drop-in for DeepSpeed's ds_to_universal.py command line.

    python3 -m ucp ds_to_universal --input_folder ckpt/global_step4 --output_folder ckpt/global_step4_universal

takes the flags of deepspeed/checkpoint/ds_to_universal.py (argparse, so
`--flag value`, `--flag=value` and unambiguous prefixes work as there) and
runs `ucp convert` with the same flags in this process: the output is byte
for byte what `ucp convert` writes. How each flag maps:

  --input_folder, --output_folder   the same
  --num_extract_workers N           ucp's threads (unless --num_threads is given)
  --num_merge_workers N             accepted and ignored: ucp merges in the same single pass
  --keep_temp_folder                ucp writes no temporary fragment files; a failed run keeps its
                                    staging folder for inspection
  --no_strict                       unused --rules patterns are not an error
  --strict                          the default (accepted for pipelines that pass it)
  --inject_missing_state            accepted and ignored: ucp never needs universal_checkpoint_info

Any other `--flag[=value]` goes to `ucp convert` as is (e.g. --preset=gpt-neox,
--progress=json, --explain). Progress shows on stderr as the CLI's does
(--progress=auto by default). Exit status 0 on success, 1 with
"ucp: MESSAGE [CODE]" on stderr on failure, 2 for a bad command line.

`python3 -m ucp convert|reshard|export --flag=value ...` runs the other
commands the same way.
"""

import argparse
import sys

import ucp


def _ds_to_universal(argv):
    parser = argparse.ArgumentParser(
        prog="python3 -m ucp ds_to_universal",
        description="DeepSpeed ZeRO checkpoint -> universal checkpoint (ucp convert, with ds_to_universal.py's flags)")
    parser.add_argument("--input_folder", type=str, required=True, help="Input DeepSpeed Checkpoint folder")
    parser.add_argument("--output_folder", type=str, required=True, help="Output DeepSpeed checkpoint folder")
    parser.add_argument("--num_extract_workers", type=int, default=None,
                        help="threads converting params (ucp's --num_threads unless that is given)")
    parser.add_argument("--num_merge_workers", type=int, default=None,
                        help="accepted and ignored: ucp merges in the extraction pass")
    parser.add_argument("--keep_temp_folder", action="store_true",
                        help="keep the staging folder of a failed run (ucp writes no temporary fragments)")
    parser.add_argument("--no_strict", dest="strict", action="store_false", default=True,
                        help="unused --rules patterns are not an error")
    parser.add_argument("--strict", dest="strict", action="store_true",
                        help="the default: unused --rules patterns are an error")
    parser.add_argument("--inject_missing_state", action="store_true",
                        help="accepted and ignored: ucp never needs universal_checkpoint_info")
    args, rest = parser.parse_known_args(argv)
    flags = {"input_folder": args.input_folder, "output_folder": args.output_folder}
    if args.num_extract_workers is not None:
        flags["num_extract_workers"] = args.num_extract_workers
    if args.num_merge_workers is not None:
        flags["num_merge_workers"] = args.num_merge_workers
    if args.keep_temp_folder:
        flags["keep_temp_folder"] = True
    if not args.strict:
        flags["no_strict"] = True
    if args.inject_missing_state:
        print("ucp: note: --inject_missing_state is not needed: ucp never requires universal_checkpoint_info",
              file=sys.stderr)
    extra = _extra_flags(parser, rest)
    flags.update(extra)
    flags.setdefault("progress", "auto")
    return _report(ucp.convert, flags)


def _extra_flags(parser, rest):
    """`--name=value`, `--name value` and `--name` (a boolean) -> kwargs."""
    out = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("--") or arg == "--":
            parser.error(f"unexpected argument: {arg}")
        body = arg[2:]
        if "=" in body:
            name, value = body.split("=", 1)
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            name, value = body, rest[i + 1]
            i += 1
        else:
            name, value = body, True
        out[name.replace("-", "_")] = value
        i += 1
    return out


def _report(fn, flags):
    try:
        summary = fn(**flags)
    except TypeError as e:
        print(f"ucp: {e}", file=sys.stderr)
        return 2
    except ucp.Error as e:
        print(f"ucp: {e}", file=sys.stderr)
        return 1
    for note in summary.notes:
        print(f"ucp: note: {note}", file=sys.stderr)
    sys.stdout.write(summary.report)
    return 0


def _command(fn, argv):
    parser = argparse.ArgumentParser(prog=f"python3 -m ucp {fn.__name__}")
    flags = _extra_flags(parser, argv)
    flags.setdefault("progress", "auto")
    return _report(fn, flags)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    commands = {"ds_to_universal": _ds_to_universal,
                "convert": lambda a: _command(ucp.convert, a),
                "reshard": lambda a: _command(ucp.reshard, a),
                "export": lambda a: _command(ucp.export, a)}
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
