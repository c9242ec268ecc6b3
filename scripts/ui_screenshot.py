"""A screenshot of a page of the MLflow UI in headless Chromium, as a fresh browser sees it (a new
profile each time): `python scripts/ui_screenshot.py URL OUT.png [--width 1500 --height 620]`;
`--text UNTIL` prints the page's text instead, once it shows UNTIL (or after --wait seconds): how
tests/integration/test_dashboard.py reads optuna-dashboard's page. Chromium's pipe takes this process's file
descriptors 3 and 4, so it runs as a process of its own.

Chromium is driven over its DevTools pipe (--remote-debugging-pipe: no extra package), so the
page can be tidied before the picture: the MLflow Assistant side panel closed and nested runs
expanded. Used for docs/models.md's picture of a sweep's runs table (docs/images/mlflow-runs.png)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

TIDY = """
(() => {
  const done = [];
  const buttons = [...document.querySelectorAll('button')];
  // The Assistant panel's own Close button: the one in the panel that has its "New Chat" button.
  const chat = buttons.find(b => b.getAttribute('aria-label') === 'New Chat');
  for (let panel = chat && chat.parentElement; panel; panel = panel.parentElement) {
    const close = panel.querySelector('button[aria-label="Close"]');
    if (close) { close.click(); done.push('assistant closed'); break; }
  }
  // Nested runs (a sweep's jobs under its parent): the expander next to each parent's name.
  for (const b of document.querySelectorAll('[role=row] button, .ag-row button')) {
    if (!(b.textContent || '').trim() && !b.getAttribute('aria-label')) { b.click(); done.push('runs expanded'); }
  }
  return done.join(', ');
})()
"""


class Pipe:
    def __init__(self, chrome: str, width: int, height: int, profile: str) -> None:
        import fcntl

        def high(fd: int) -> int:  # out of the way of 3 and 4, which Chromium's pipe needs
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            return moved

        to_chrome_r, self.to_chrome = (high(fd) for fd in os.pipe())
        self.from_chrome, from_chrome_w = (high(fd) for fd in os.pipe())
        # Chromium reads commands on fd 3 and answers on fd 4.
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)
        self.proc = subprocess.Popen(
            [
                chrome,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (3, 4, to_chrome_r, from_chrome_w):
            os.close(fd)
        self.next_id, self.buffer = 0, b""

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium went away")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _text_once(pipe: Pipe, session: str, until: str, wait: float) -> str:
    deadline, text = time.monotonic() + wait, ""
    while time.monotonic() < deadline:
        answer = pipe.call(
            "Runtime.evaluate", session, expression="document.body.innerText", returnByValue=True
        )
        text = answer["result"].get("value") or ""
        if until in text:
            break
        time.sleep(0.5)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=620)
    parser.add_argument("--debug", action="store_true", help="print the page's buttons")
    parser.add_argument(
        "--wait", type=float, default=15.0, help="seconds for the page to load its runs"
    )
    parser.add_argument(
        "--text", metavar="UNTIL", help="print the page's text once it shows UNTIL (OUT is ignored)"
    )
    args = parser.parse_args()
    chrome = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if chrome is None:
        print("error: no chromium on PATH (apt-get install -y chromium)", file=sys.stderr)
        return 1
    profile = tempfile.mkdtemp(prefix="seqlab-chromium-")
    pipe = Pipe(chrome, args.width, args.height, profile)
    try:
        target = pipe.call("Target.createTarget", url=args.url)["targetId"]
        session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=args.width,
            height=args.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        if args.text is not None:
            print(_text_once(pipe, session, args.text, args.wait))
            return 0
        time.sleep(args.wait)
        if args.debug:
            listing = "[...document.querySelectorAll('button,[role=checkbox],label')].map(b => b.tagName + '|' + (b.getAttribute('aria-label')||'') + '|' + (b.textContent||'').slice(0,30) + '|' + (b.className||'').toString().slice(0,40)).join('\\n')"
            print(
                pipe.call("Runtime.evaluate", session, expression=listing, returnByValue=True)[
                    "result"
                ]["value"]
            )
        tidied = pipe.call("Runtime.evaluate", session, expression=TIDY, returnByValue=True)
        print("tidied:", tidied.get("result", {}).get("value"))
        time.sleep(3)
        shot = pipe.call("Page.captureScreenshot", session, format="png")
        with open(args.out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(
            "final URL:",
            pipe.call("Runtime.evaluate", session, expression="location.href", returnByValue=True)[
                "result"
            ]["value"],
        )
    finally:
        pipe.close()
        shutil.rmtree(profile, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
