// Python off the page's thread: Pyodide, the estimator package (estimator.zip) and web/bridge.py live here, so the
// form stays responsive while the CLI computes. Messages in: {id, argv, extra, files}; out: {id, result} with the
// bridge's {code, stdout, stderr, argv}, or {ready: true} / {bootError} once at start.
import { loadPyodide } from "./pyodide/pyodide.mjs";

const base = new URL("./", import.meta.url).href;
const zip = fetch(base + "estimator.zip").then((r) => {
  if (!r.ok) throw new Error(`estimator.zip: HTTP ${r.status}`);
  return r.arrayBuffer();
});

const ready = (async () => {
  const py = await loadPyodide({ indexURL: base + "pyodide/", env: { HOME: "/home/pyodide", HF_HUB_OFFLINE: "1" } });
  self.postMessage({ stage: "python" });
  py.unpackArchive(await zip, "zip", { extractDir: "/home/pyodide/site" });
  py.runPython("import sys; sys.path.insert(0, '/home/pyodide/site')");
  const bridge = py.pyimport("bridge");
  self.postMessage({ ready: true });
  return bridge;
})();
ready.catch((e) => self.postMessage({ bootError: String((e && e.message) || e) }));

self.onmessage = async (e) => {
  const { id, ...req } = e.data;
  const bridge = await ready;
  self.postMessage({ id, result: JSON.parse(bridge.run(JSON.stringify(req))) });
};
