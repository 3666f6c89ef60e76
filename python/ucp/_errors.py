"""ucp's exceptions: one ucp.Error subclass per absl status code.

Every failure of the C++ library is an absl::Status; the extension raises it
as the subclass of its code, e.g. a missing file as ucp.NotFoundError. Each
carries `code` (the absl::StatusCode number), `code_name` ("NOT_FOUND") and
`message` (the C++ message: it names the file, the param, expected vs
found). Some also derive from the matching built-in exception, so
`except FileNotFoundError` or `except ValueError` work as expected.
"""


class Error(Exception):
    """A failed ucp operation: `code`, `code_name` and `message` of its status."""

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message, code=None, code_name=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if code_name is not None:
            self.code_name = code_name

    def __str__(self):
        return f"{self.message} [{self.code_name}]"


def _make(name, code, code_name, *bases, doc):
    cls = type(name, (Error,) + bases, {"code": code, "code_name": code_name, "__doc__": doc,
                                       "__module__": "ucp"})
    return cls


CancelledError = _make("CancelledError", 1, "CANCELLED", doc="The operation was cancelled.")
UnknownError = _make("UnknownError", 2, "UNKNOWN", doc="An error of no other code.")
InvalidArgumentError = _make("InvalidArgumentError", 3, "INVALID_ARGUMENT", ValueError,
                             doc="A bad option or flag value, or an input that cannot be what it claims.")
DeadlineExceededError = _make("DeadlineExceededError", 4, "DEADLINE_EXCEEDED", TimeoutError,
                              doc="A deadline passed.")
NotFoundError = _make("NotFoundError", 5, "NOT_FOUND", FileNotFoundError,
                      doc="A file, folder, param or state that does not exist.")
AlreadyExistsError = _make("AlreadyExistsError", 6, "ALREADY_EXISTS", FileExistsError,
                           doc="The output exists (pass overwrite=True to replace it once the new one is complete).")
PermissionDeniedError = _make("PermissionDeniedError", 7, "PERMISSION_DENIED", PermissionError,
                              doc="The file system refused access.")
ResourceExhaustedError = _make("ResourceExhaustedError", 8, "RESOURCE_EXHAUSTED",
                               doc="Out of space, memory or another resource.")
FailedPreconditionError = _make("FailedPreconditionError", 9, "FAILED_PRECONDITION",
                                doc="The operation cannot run in this state (e.g. a rule is ambiguous).")
AbortedError = _make("AbortedError", 10, "ABORTED", doc="The operation was aborted.")
OutOfRangeError = _make("OutOfRangeError", 11, "OUT_OF_RANGE", doc="A value or offset out of range.")
UnimplementedError = _make("UnimplementedError", 12, "UNIMPLEMENTED", NotImplementedError,
                           doc="A checkpoint feature ucp does not support (e.g. ZeRO stage 3).")
InternalError = _make("InternalError", 13, "INTERNAL", doc="A bug in ucp.")
UnavailableError = _make("UnavailableError", 14, "UNAVAILABLE", doc="A resource is unavailable.")
DataLossError = _make("DataLossError", 15, "DATA_LOSS", doc="A damaged input: bad CRC, truncated file, ...")
UnauthenticatedError = _make("UnauthenticatedError", 16, "UNAUTHENTICATED", doc="Not authenticated.")

_BY_CODE = {cls.code: cls for cls in (
    CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError, AlreadyExistsError,
    PermissionDeniedError, ResourceExhaustedError, FailedPreconditionError, AbortedError, OutOfRangeError,
    UnimplementedError, InternalError, UnavailableError, DataLossError, UnauthenticatedError)}

__all__ = ["Error"] + sorted(cls.__name__ for cls in _BY_CODE.values())


def from_status(code, code_name, message):
    """The exception for a failed absl::Status (called by the extension)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, code, code_name)
