"""Why the round state machine refuses a request, as domain errors: what happened, not how
HTTP says it. :mod:`server.errors` maps each to its status and error code, in one table."""

from __future__ import annotations


class RefusalError(Exception):
    """``retry_after``: seconds after which the same request may succeed (None: it will not)."""

    def __init__(self, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class RunFinishedError(RefusalError):
    """The run reached its last round, or the operator stopped it."""

    def __init__(self) -> None:
        super().__init__("the run is finished")


class AlreadyReportedError(RefusalError):
    """The device's update of this round was already accepted."""


class RoundNotOpenError(RefusalError):
    """The round is not the open one."""


class NotInCohortError(RefusalError):
    """The device holds no slot of the round's cohort."""


class StaleBaseError(RefusalError):
    """The update was trained from another model version than the round's."""


class DeviceRevokedError(RefusalError):
    """The operator revoked the device."""


class UnknownVersionError(RefusalError):
    """No such model version (or its file is gone)."""


class DrainingError(RefusalError):
    """The server takes no writes until its disk has room."""


class SecureStageError(RefusalError):
    """Since revision 1.6: the secure round's stage this request belongs to is over, or this
    device is no longer in it."""


class SecureStageNotOpenError(RefusalError):
    """Since revision 1.7: the secure round's stage this request belongs to has not begun."""


class SecureMessageError(RefusalError):
    """Since revision 1.6: a secure round's message that does not fit (docs/SECAGG.md)."""


class SecureRoundError(RefusalError):
    """Since revision 1.6: a plain upload into a secure round."""


class SecAggUnsupportedError(RefusalError):
    """Since revision 1.6: the server runs secure rounds and the device cannot take part."""


class PrivacyBudgetSpentError(RefusalError):
    """Since revision 1.7: a rollback would let a DP run publish past ``--target-epsilon``."""
