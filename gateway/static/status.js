// The status view: GET /v1/status every few seconds while it is open (queues, workers online,
// cache hit ratios, the latency of the latest jobs) and a link to Flower.
import { request } from "./api.js";
import { element } from "./thread.js";

const REFRESH_MS = 3000;
const $ = (id) => document.getElementById(id);

const percent = (ratio) => (ratio == null ? "—" : `${(ratio * 100).toFixed(0)} %`);
const ms = (seconds) => (seconds == null ? "—" : `${Math.round(seconds * 1000)} ms`);

export class StatusView {
  constructor(onModel) {
    this.onModel = onModel;
    this.timer = null;
    $("status-toggle").addEventListener("click", () => this.toggle());
  }

  toggle() {
    const open = $("status").hidden;
    $("status").hidden = !open;
    $("status-toggle").setAttribute("aria-expanded", String(open));
    clearInterval(this.timer);
    if (open) {
      this.refresh();
      this.timer = setInterval(() => this.refresh(), REFRESH_MS);
    }
  }

  async refresh() {
    try {
      this.render(await request("/v1/status"));
      $("status-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      $("status-updated").textContent = `Status unavailable: ${err.message}`;
    }
  }

  async loadModel() {
    try {
      this.onModel((await request("/v1/status")).model);
    } catch {
      // the key dialog (401) or the error region already said why
    }
  }

  render(status) {
    this.onModel(status.model);
    $("status-body").replaceChildren(
      section("Queues", queueTable(status.queues)),
      section("Inference workers online", workerTable(status.workers)),
      section("Cache hit ratios", cacheTable(status.caches)),
      section("Recent latency", latencyTable(status.recent)),
      flowerLink(status.flower_url),
    );
  }
}

function section(title, body) {
  const part = element("div", { class: "status-part" });
  part.append(element("h3", {}, title), body);
  return part;
}

function table(caption, headings, rows) {
  const node = element("table");
  node.append(element("caption", { class: "visually-hidden" }, caption));
  const head = element("tr");
  for (const text of headings) head.append(element("th", { scope: "col" }, text));
  node.append(head);
  for (const cells of rows) {
    const row = element("tr");
    cells.forEach((text, i) => row.append(element(i ? "td" : "th", i ? {} : { scope: "row" }, String(text))));
    node.append(row);
  }
  return node;
}

function queueTable(queues) {
  const rows = Object.entries(queues.decode).map(([name, waiting]) => [`${name} (decode tasks)`, waiting]);
  rows.push(["inference backlog (not read yet)", queues.inference.backlog]);
  rows.push(["inference in flight", queues.inference.in_flight]);
  return table("Queue depths", ["queue", "jobs"], rows);
}

function workerTable(workers) {
  if (!workers.length) return element("p", { class: "error-text" }, "No inference worker is online.");
  const rows = workers.map((w) => [
    w.id,
    w.healthy ? (w.stopping ? "stopping" : "healthy") : "unhealthy",
    `${w.model || "?"} on ${w.device || "?"}`,
    `${w.in_flight} / ${w.capacity}`,
    `${w.running} running, ${w.waiting} waiting`,
  ]);
  return table("Inference workers", ["worker", "state", "model", "jobs / capacity", "engine"], rows);
}

function cacheTable(caches) {
  const rows = Object.entries(caches).map(([name, c]) => [name, percent(c.hit_ratio), `${c.hits} / ${c.lookups}`]);
  if (!rows.length) return element("p", { class: "muted" }, "No cache figures yet.");
  return table("Cache hit ratios", ["cache", "hit ratio", "hits / lookups"], rows);
}

function latencyTable(recent) {
  if (!recent || !recent.jobs) return element("p", { class: "muted" }, "No job has finished yet.");
  const rate = recent.tokens_per_s == null ? "—" : `${recent.tokens_per_s.toFixed(1)} tokens/s`;
  const note = element("p", { class: "muted" }, `Last ${recent.jobs} jobs, over ${Math.round(recent.window_s)} s; ${rate}`);
  const rows = [
    ["time to first token", ms(recent.ttft_s.p50), ms(recent.ttft_s.p95)],
    ["whole job", ms(recent.total_s.p50), ms(recent.total_s.p95)],
  ];
  const part = element("div");
  part.append(note, table("Latency of the latest jobs", ["", "median", "95th percentile"], rows));
  return part;
}

function flowerLink(url) {
  const line = element("p");
  if (!url) {
    line.textContent = "Flower (Celery monitoring): not configured (VLMQ_FLOWER_URL).";
    return line;
  }
  const link = element("a", { href: url, target: "_blank", rel: "noopener" }, "Open Flower");
  line.append(link, " (Celery monitoring: decode tasks and workers; it has its own login)");
  return line;
}
