"""Why the server refuses a request, as domain errors: what happened, not how HTTP says it.
Every module below the routes raises these; :mod:`server.errors` maps each to its status and
error code, in one table."""

from __future__ import annotations


class RefusalError(Exception):
    """``retry_after``: seconds after which the same request may succeed (None: it will not);
    ``challenge``: a 401's WWW-Authenticate, for a browser to ask its user (the dashboard)."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.challenge: str | None = None


class CodedRefusalError(RefusalError):
    """A refusal whose protocol code depends on what exactly was wrong (which check of a body)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class MalformedError(CodedRefusalError):
    """A body that cannot be read as the protocol's encoding."""


class UnacceptableError(CodedRefusalError):
    """A well-formed body with the wrong content."""


class UnauthorizedError(RefusalError):
    """A missing, unknown or revoked token, or a wrong enrollment key."""


class ForbiddenError(RefusalError):
    """A token of the wrong role for the endpoint."""


ROOT_TAKES_NO_DEVICES = "this server is the root of a tree of servers: devices enroll at their region's server"


class NotFoundError(RefusalError):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} does not exist")


class ServerBusyError(RefusalError):
    """The server cannot take the request now; the same request may succeed after ``retry_after``."""


class DrainingError(ServerBusyError):
    """The server takes no writes until its disk has room."""


class RateLimitedError(RefusalError):
    """Too many requests of this kind from this address (or from all together)."""


class UploadInProgressError(RefusalError):
    """The device is already sending an update."""


class BodyTooLargeError(RefusalError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")


class BodyTimeoutError(RefusalError):
    """The body did not arrive in time, or too slowly."""


class AttestationFailedError(RefusalError):
    """The enrollment's attestation is missing or refused."""


class RunFinishedError(RefusalError):
    """The run reached its last round, or the operator stopped it."""

    def __init__(self) -> None:
        super().__init__("the run is finished")


class AlreadyReportedError(RefusalError):
    """The device's update of this round was already accepted."""


class RoundNotOpenError(RefusalError):
    """The round is not the open one."""


class RoundClosingError(RoundNotOpenError):
    """The round is sealed: a process is aggregating it (:mod:`server.storage.closers`)."""


class NotInCohortError(RefusalError):
    """The device holds no slot of the round's cohort."""


class StaleBaseError(RefusalError):
    """The update was trained from another model version than the round's."""


class DeviceRevokedError(RefusalError):
    """The operator revoked the device."""


class UnknownVersionError(RefusalError):
    """No such model version (or its file is gone)."""


class SecureStageError(RefusalError):
    """The secure round's stage this request belongs to is over, or this device is no longer in it."""


class SecureStageNotOpenError(RefusalError):
    """The secure round's stage this request belongs to has not begun."""


class SecureMessageError(RefusalError):
    """A secure round's message that does not fit (docs/SECAGG.md)."""


class SecureRoundError(RefusalError):
    """A plain upload into a secure round."""


class SecAggUnsupportedError(RefusalError):
    """The server runs secure rounds and the device cannot take part."""


class PrivacyBudgetSpentError(RefusalError):
    """A rollback would let a DP run publish past ``--target-epsilon``."""
