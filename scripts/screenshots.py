"""Screenshots of the chat for docs/screenshots/ (linked from the README), in English (light theme) and Chinese
(dark theme): the first page, a reply with its details, the / command menu and a stopped reply.

The app runs as `make run` runs it offline: the demo model on llama.cpp (the hub is out of reach), on a free port
with its data in a temporary folder; Debian's Chromium takes the pictures. Needs `make setup` (both environments,
llama.cpp built) and a CJK font for the Chinese pages (Debian: fonts-wqy-microhei).

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.async_api import async_playwright

from tests.app_process import CHROMIUM, CHROMIUM_ARGS, READY, REPLY, RunningApp, start_app

SHOTS = {"en-US": ("en", "light"), "zh-CN": ("zh", "dark")}
QUESTION = "Explain this code: sorted(words, key=len, reverse=True)[:3]"  # the demo model writes English only
LONG = "Write a long story about a robot who learns to paint."
WAIT_MS = 300_000


async def finished(page: Any, n: int) -> None:
    """Wait until n replies show their details (they finished)."""
    await page.wait_for_function("n => document.querySelectorAll('.reply-details').length >= n", arg=n,
                                 timeout=WAIT_MS)  # fmt: skip


async def shoot(browser: Any, app: RunningApp, locale: str, out: Path) -> None:
    lang, theme = SHOTS[locale]
    context = await browser.new_context(locale=locale, color_scheme=theme, viewport={"width": 1280, "height": 800})
    await context.add_init_script(f"localStorage.setItem('vite-ui-theme', '{theme}')")
    page = await context.new_page()
    await page.goto(app.url)
    await page.wait_for_selector(READY, timeout=WAIT_MS)
    await page.wait_for_selector('#ernie-status .ernie-state[data-state="ready"]', timeout=WAIT_MS)
    await page.screenshot(path=out / f"first-page-{lang}.png")

    await page.click("#chat-input")
    await page.keyboard.type(QUESTION)
    await page.keyboard.press("Enter")
    await finished(page, 1)
    await page.mouse.move(0, 0)
    await page.screenshot(path=out / f"reply-details-{lang}.png")

    await page.click("#chat-input")
    await page.keyboard.type("/")
    await page.locator("[cmdk-item]").first.wait_for(timeout=WAIT_MS)
    await page.screenshot(path=out / f"command-menu-{lang}.png")
    await page.keyboard.press("Backspace")

    before = await page.locator(REPLY).count()
    # stop from inside the page once some text is there (a short reply may end before a click from here lands)
    await page.evaluate(
        """([sel, n]) => new MutationObserver((_, obs) => {
             const reply = document.querySelectorAll(sel)[n];
             const stop = document.querySelector('#stop-button');
             if (reply && (reply.innerText || '').length > 80 && stop) {
               window.__stopped = (reply.innerText || '').length; stop.click(); obs.disconnect();
             }
           }).observe(document.body, {subtree: true, childList: true, characterData: true})""",
        [REPLY, before],
    )
    await page.keyboard.type(LONG)
    await page.keyboard.press("Enter")
    await finished(page, 2)
    print(locale, "stopped at", await page.evaluate("() => window.__stopped"), "characters")
    await page.mouse.move(0, 0)
    await page.screenshot(path=out / f"stopped-reply-{lang}.png")
    await context.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"), help="where the PNG files go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ernie-shots-") as tmp:
        data = Path(tmp) / "data"
        app = start_app(data, engine__name="llama.cpp", HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))
        try:
            await asyncio.to_thread(app.wait_ready)
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                for locale in SHOTS:
                    await shoot(browser, app, locale, args.out)
                await browser.close()
        finally:
            app.kill()
    print("\n".join(str(p) for p in sorted(args.out.glob("*.png"))))


if __name__ == "__main__":
    asyncio.run(main())
