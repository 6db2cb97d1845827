"""The learned store: one SQLite file holding learned state per model and device, request
summaries and the TUI's conversations (issue 5). See ``db.Store`` for the API the engine and the
UI code against (its chats' part in ``chats``), ``fingerprint`` for the keys, ``transfer`` for
export/import and ``commands`` for ``adaspark store ...``."""

from adaspark_app.errors import StoreError

from .chats import title_from
from .db import ENV_VAR, Store, default_store_path
from .fingerprint import (
    LearnedKey,
    device_fingerprint,
    drafter_fingerprint,
    key_meta,
    model_fingerprint,
)
from .migrations import APPLICATION_ID, MIGRATIONS, migrate, migration, schema_version
from .transfer import FORMAT as EXPORT_FORMAT
from .transfer import VERSION as EXPORT_VERSION

__all__ = [
    "APPLICATION_ID",
    "ENV_VAR",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "LearnedKey",
    "MIGRATIONS",
    "Store",
    "StoreError",
    "default_store_path",
    "device_fingerprint",
    "drafter_fingerprint",
    "key_meta",
    "migrate",
    "migration",
    "model_fingerprint",
    "schema_version",
    "title_from",
]
