// Test driver (tests/contracts/test_web.py), not part of the site: opens the built page in headless Chromium (the system's
// /usr/bin/chromium through playwright-core), with every request that would leave 127.0.0.1 aborted and recorded,
// then sets each case's URL hash and collects what the page answered and showed.
// usage: node web/drive.mjs JOB.json   JOB = {url, cases: [hash, ...], chromium?, screenshot?, timeout_ms?}
// prints one JSON object: {first, cases, requests, left, console, timing}
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const timeout = job.timeout_ms ?? 30000;
const browser = await chromium.launch({
  executablePath: job.chromium ?? "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const out = { requests: [], left: [], console: [], cases: [] };
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const local = (u) => {
    const url = new URL(u);
    return url.protocol === "data:" || url.protocol === "blob:" || url.protocol === "file:" || url.hostname === "127.0.0.1";
  };
  await context.route("**/*", (route) => {
    const u = route.request().url();
    if (local(u)) return route.continue();
    out.left.push(u);
    return route.abort();
  });
  const page = await context.newPage();
  page.on("request", (r) => out.requests.push(r.url()));
  page.on("websocket", (w) => out.left.push(w.url()));
  page.on("console", (m) => { if (m.type() === "error" || m.type() === "warning") out.console.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", (e) => out.console.push(`pageerror: ${e.message}`));

  await page.goto(job.url + (job.first_hash ? "#" + job.first_hash : ""));
  out.first = await page.evaluate((ms) => new Promise((resolve, reject) => {
    const done = () => resolve({ ...window.vramPage.last, timing: window.vramPage.timing,
      dom_content_loaded_ms: performance.getEntriesByType("navigation")[0]?.domContentLoadedEventEnd });
    if (window.vramPage && (window.vramPage.last || window.vramPage.bootError)) return done();
    window.addEventListener("vram-answer", done, { once: true });
    setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  }), timeout);
  if (job.screenshot) await page.screenshot({ path: job.screenshot, fullPage: true });
  const viaHash = (h) => page.evaluate(([h, ms]) => new Promise((resolve, reject) => {
    window.addEventListener("vram-answer", (e) => resolve(e.detail), { once: true });
    if (location.hash === "#" + h || (h === "" && location.hash === "")) window.vramPage.answer(); // no hashchange
    else location.hash = h;
    setTimeout(() => reject(new Error(`no answer for #${h} within ${ms} ms`)), ms);
  }), [h, timeout]);
  for (const c of job.cases) {
    let detail;
    if (typeof c === "string") {
      detail = await viaHash(c); // a link: set the URL hash, as opening a shared link would
    } else {
      // a user at the form: from the state of link c.start, {fill: [[field name, value], ...]} typed / chosen
      // in order, then the answer for the state the form ends in (the URL hash follows the form)
      await viaHash(c.start);
      for (const [name, value] of c.fill) {
        const sel = `[name="${name}"]`;
        const kind = await page.$eval(sel, (e) => e.tagName + ":" + e.type);
        if (kind.startsWith("SELECT")) await page.selectOption(sel, value);
        else if (kind.endsWith("checkbox")) await page.setChecked(sel, value === "1");
        else await page.fill(sel, value);
      }
      await page.waitForFunction(() => window.vramPage.last && window.vramPage.last.hash === location.hash &&
        !document.getElementById("answer").classList.contains("busy"), null, { timeout });
      detail = await page.evaluate(() => window.vramPage.last);
    }
    // what the page shows, read back from the DOM
    detail.dom = await page.evaluate(() => ({
      verdict: document.getElementById("verdict").hidden ? null : document.getElementById("verdict").textContent,
      error: document.getElementById("error").hidden ? null : document.getElementById("error").textContent,
      json: document.getElementById("json").textContent,
      fits: [...document.querySelectorAll("#fits tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent)),
    }));
    out.cases.push(detail);
    if (job.case_screenshots) await page.screenshot({ path: `${job.case_screenshots}-${out.cases.length}.png`, fullPage: true });
  }
} catch (e) {
  out.error = String(e && e.stack ? e.stack : e);
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out));
