"""Writing evenshard datasets with Apache Beam: ``evenshard convert`` and its steps."""

from schemas.errors import Error

__all__ = ["Error"]
