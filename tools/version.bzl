"""The release of ucp: the binary's `--version` and the wheels' version."""

UCP_VERSION = "0.1.0"
