// narrator serve's web page in a real browser (Debian's Chromium, headless, driven by
// playwright-core): signs in when given a token, submits a book through the form, follows
// the job page's live state to done, checks the players and a download, keeps a
// screenshot, and looks at the pages with JavaScript off. Prints one JSON line of what it
// saw; tests/serve_page.rs judges it.
//
//   node job_page.mjs BASE_URL BOOK SCREENSHOT [TOKEN]
import { chromium } from "playwright-core";

const [base, book, screenshot, token] = process.argv.slice(2);
const seen = { states: [], errors: [] };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--autoplay-policy=no-user-gesture-required"],
});
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 900 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => seen.errors.push(String(e)));
  await page.goto(base + "/");
  seen.first_url = page.url();
  if (token) {
    await page.getByLabel("Token").fill(token);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForURL(base + "/");
  }
  // Every form control has a label.
  seen.unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, select, textarea")]
      .filter((e) => e.type !== "hidden" && e.labels.length === 0)
      .map((e) => e.id || e.name),
  );
  // The voice's preview plays.
  await page.getByRole("button", { name: "Play a preview" }).click();
  seen.preview_seconds = await page.evaluate(
    () =>
      new Promise((done) => {
        const a = document.getElementById("preview-audio");
        if (a.readyState >= 1 && a.duration) return done(a.duration);
        a.addEventListener("loadedmetadata", () => done(a.duration), { once: true });
        a.addEventListener("error", () => done(-1), { once: true });
      }),
  );
  // Submit the book, by keyboard where a user would type.
  await page.getByLabel("A file (.txt, .md or .epub)").setInputFiles(book);
  await page.getByLabel("Format").selectOption("mp3");
  await page.getByLabel("One file per chapter too").check();
  await page.getByLabel("SRT subtitles").check();
  await page.getByRole("button", { name: "Make the audiobook" }).focus();
  await page.keyboard.press("Enter");
  await page.waitForURL(/\/jobs\/[0-9a-f-]{36}$/);
  seen.job_url = page.url();
  // The state as the live stream shows it, until the page shows the players.
  const deadline = Date.now() + 300_000;
  while (Date.now() < deadline) {
    const state = await page.locator("#state").textContent().catch(() => null);
    if (state && seen.states.at(-1) !== state.trim()) seen.states.push(state.trim());
    if (state?.trim() === "done" && (await page.locator("audio[data-kind=chapter]").count()) > 0) break;
    await page.waitForTimeout(100);
  }
  seen.progress_text = await page.locator("#progress-text").textContent();
  // A chapter's player loads, with a duration.
  seen.chapter_seconds = await page.evaluate(
    () =>
      new Promise((done) => {
        const a = document.querySelector("audio[data-kind=chapter]");
        if (a.readyState >= 1 && a.duration) return done(a.duration);
        a.addEventListener("loadedmetadata", () => done(a.duration), { once: true });
        a.addEventListener("error", () => done(-1), { once: true });
        a.load();
      }),
  );
  seen.players = await page.locator("audio").count();
  // A download link returns its file.
  const link = page.locator("a[download][data-kind=book]");
  const [download] = await Promise.all([page.waitForEvent("download"), link.click()]);
  seen.download_name = download.suggestedFilename();
  const path = await download.path();
  seen.download_bytes = path ? (await import("node:fs")).statSync(path).size : 0;
  await page.screenshot({ path: screenshot, fullPage: true });

  // Without JavaScript: the list and the job page show the work.
  const plain = await browser.newContext({ javaScriptEnabled: false });
  if (token) {
    const cookies = await context.cookies();
    await plain.addCookies(cookies);
  }
  const p2 = await plain.newPage();
  await p2.goto(base + "/");
  seen.nojs_rows = await p2.locator("#jobs tbody tr").count();
  await p2.goto(seen.job_url);
  seen.nojs_state = (await p2.locator("#state").textContent())?.trim();
  seen.nojs_players = await p2.locator("audio").count();
} catch (e) {
  seen.failure = String(e.stack || e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));
