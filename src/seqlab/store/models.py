"""A run's logged models as its store answers a search for them: every page."""

from __future__ import annotations

from typing import Any, Iterator, Optional


def run_models(client: Any, run: Any, name: Optional[str] = None) -> Iterator[Any]:
    """The run's logged models (named `name`, if given), every page of them: MLflow answers a search
    a page (100) at a time, and one sweep=device_batch logs 630 models in its experiment."""
    where = f"source_run_id = '{run.info.run_id}'" + (f" AND name = '{name}'" if name else "")
    token = None
    while True:
        page = client.search_logged_models(
            [run.info.experiment_id], filter_string=where, page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return
