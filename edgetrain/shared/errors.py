"""The one error type that carries a user-facing message to the CLI edge."""


class EdgetrainError(Exception):
    """A problem the user can fix; ``str()`` is one line naming the problem and the fix."""

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} - {fix}" if fix else problem)


class UsageError(EdgetrainError):
    exit_code = 2


class Interrupted(EdgetrainError):
    exit_code = 130
