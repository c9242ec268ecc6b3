"""The picture of the MLflow UI in docs/models.md: a sweep's runs grouped by their `config` tag, each group
with the mean of its repeats' best_val_rmse and samples_per_s_median. Drives a headless Chromium
through the UI as a user clicks it (Group by -> config; Columns -> the metrics): its menus need
real clicks, which scripts/ui_screenshot.py (a page as it loads, over Chromium's DevTools pipe)
does not make.

Not part of the project's install: it needs Playwright (`pip install playwright` in a venv of its
own) and a Chromium (`apt-get install chromium`). How that picture was made:

    .venv/bin/python train.py -m seed=0,1,2 data.batch_size=32,64 trainer.max_epochs=4 data.n_samples=512 paths.root_dir=/tmp/shot
    .venv/bin/mlflow ui --backend-store-uri sqlite:////tmp/shot/mlruns/mlflow.db --port 5055 &
    /tmp/pwvenv/bin/python scripts/ui_grouped_screenshot.py http://127.0.0.1:5055 1 docs/images/runs-grouped-by-config.png
"""

from __future__ import annotations

import sys

from playwright.sync_api import Page, sync_playwright

METRICS = ("best_val_rmse", "samples_per_s_median")
HIDDEN = ("Dataset", "Source", "Models")  # attribute columns that push the metrics off the picture


def _menu_entry(page: Page, name: str, search_box) -> None:
    """Click `name` in the open Columns menu (the table's headers carry the same words)."""
    entries = [
        e
        for e in page.get_by_text(name, exact=True).all()
        if (box := e.bounding_box())
        and box["y"] > search_box["y"]
        and box["x"] < search_box["x"] + search_box["width"]
    ]
    entries[0].click()
    page.wait_for_timeout(600)


def main(ui: str, experiment_id: str, out: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 640})
        page.goto(
            f"{ui}/#/experiments/{experiment_id}?workflowType=machine_learning", wait_until="load"
        )
        page.wait_for_selector(
            "text=sweep-", timeout=60000
        )  # the sweep's parent run: the table is there
        page.wait_for_timeout(2000)
        page.mouse.click(1464, 35)  # closes the assistant panel, which takes a third of the width
        page.get_by_role("button", name="Group by").click()
        page.get_by_placeholder("Search").last.fill("config")
        page.wait_for_timeout(800)
        page.get_by_text("config", exact=True).first.click()
        page.wait_for_timeout(800)
        page.keyboard.press("Escape")
        page.get_by_role("button", name="Columns").click()
        page.wait_for_timeout(800)
        search = page.get_by_placeholder("Search columns").bounding_box()
        for name in HIDDEN:
            _menu_entry(page, name, search)
        for name in METRICS:
            page.get_by_placeholder("Search columns").fill(name)
            page.wait_for_timeout(1200)
            _menu_entry(page, name, search)
        page.keyboard.press("Escape")
        page.wait_for_timeout(1500)
        page.screenshot(path=out, clip={"x": 0, "y": 0, "width": 1110, "height": 610})
        browser.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: ui_grouped_screenshot.py UI_URL EXPERIMENT_ID OUT.png")
    main(*sys.argv[1:])
