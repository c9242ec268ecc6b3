"""What tests/unit/store/test_local.py and tests/integration/test_store.py share."""

from __future__ import annotations

import sqlite3


def _sql(db, *statements):
    con = sqlite3.connect(db)
    with con:
        for statement in statements:
            con.execute(statement)
    con.close()
