"""The one application error type. Services raise it; the API and views turn it into a clean 400."""


class ApplicationError(Exception):
    def __init__(self, message: str, *, field_errors: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.message = message
        self.field_errors = field_errors or {}

    def as_dict(self) -> dict:
        return {"message": self.message, "field_errors": self.field_errors}
