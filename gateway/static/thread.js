// The conversation as a list of turns: the question, the answer as it streams, then its figures
// (time to first token, tokens per second, every stage's time as the server measured it).

const STAGES = ["queue", "decode", "wait", "vision", "prefill", "generation", "total"];
const STATUS_LABELS = {
  queued: "Queued",
  decoding: "Reading the image",
  waiting: "Waiting for the model",
  generating: "Answering",
};

export function element(tag, attributes = {}, text = "") {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  if (text) node.textContent = text;
  return node;
}

const ms = (seconds) => `${Math.round((seconds || 0) * 1000)} ms`;

export function tokensPerSecond(usage, timings) {
  const tokens = usage ? usage.completion_tokens : 0;
  if (!timings || !(timings.generation > 0) || tokens < 2) return null;
  return (tokens - 1) / timings.generation; // the first token is TTFT's, the rest took `generation`
}

export class Turn {
  constructor(thread, question) {
    this.attempt = 1;
    this.tokens = 0; // token events received: the answer streamed (a cached one arrives whole)
    this.item = element("li", { class: "turn", "data-state": "sending" });
    const asked = element("div", { class: "question" });
    asked.append(element("span", { class: "who" }, "You"), element("p", {}, question));
    const answer = element("div", { class: "reply" });
    this.text = element("p", { class: "answer", "aria-live": "polite", "aria-busy": "true" });
    this.state = element("p", { class: "state muted" }, "Sending…");
    this.figures = element("div", { class: "figures" });
    answer.append(element("span", { class: "who" }, "vlmq-tiny"), this.text, this.state, this.figures);
    this.item.append(asked, answer);
    thread.append(this.item);
  }

  accepted(job) {
    this.item.dataset.jobId = job.id;
    this.show("queued", job.result_cached ? "From the result cache" : STATUS_LABELS.queued);
  }

  status(status, attempt) {
    this.restartIf(attempt);
    if (STATUS_LABELS[status] && this.item.dataset.state !== "stopping") {
      this.show(status, STATUS_LABELS[status]);
    }
  }

  token(text, attempt) {
    this.restartIf(attempt);
    this.tokens += 1;
    this.item.dataset.tokenEvents = String(this.tokens);
    this.text.append(text);
  }

  // A retried job starts its answer over: the earlier attempt's tokens are dropped.
  restartIf(attempt) {
    if (attempt === this.attempt) return;
    this.attempt = attempt;
    this.tokens = 0;
    this.text.textContent = "";
  }

  show(state, label) {
    this.item.dataset.state = state;
    this.state.textContent = label;
  }

  end(event) {
    if (event.final_text != null && this.tokens === 0) this.text.textContent = event.final_text;
    this.text.setAttribute("aria-busy", "false");
    const status = event.type === "done" ? "done" : event.status;
    const labels = { done: "", cancelled: "Stopped", expired: "Expired: it ran past its deadline" };
    const label = status in labels ? labels[status] : `Failed: ${event.error || "unknown error"}`;
    this.show(status === "cancelled" ? "stopped" : status, label);
    this.state.hidden = !label;
    if (event.usage || event.timings) this.figures.append(...figures(event.usage, event.timings));
    return label || "Answer complete";
  }

  fail(message) {
    this.text.setAttribute("aria-busy", "false");
    this.show("failed", message);
  }

  remove() {
    this.item.remove();
  }
}

function figures(usage, timings) {
  const rate = tokensPerSecond(usage, timings);
  const parts = [`TTFT ${ms(timings && timings.ttft)}`];
  parts.push(rate === null ? "— tokens/s" : `${rate.toFixed(1)} tokens/s`);
  if (usage) parts.push(`${usage.completion_tokens} tokens`);
  if (usage && usage.cached_tokens) parts.push(`${usage.cached_tokens} prompt tokens cached`);
  const line = element("p", { class: "summary" }, parts.join(" · "));
  if (!timings) return [line];
  const details = element("details", { class: "stages" });
  details.append(element("summary", {}, "Stage timings"), stageTable(timings));
  return [line, details];
}

function stageTable(timings) {
  const table = element("table");
  table.append(element("caption", { class: "visually-hidden" }, "Time per stage"));
  for (const stage of STAGES) {
    const row = element("tr");
    row.append(element("th", { scope: "row" }, stage), element("td", {}, ms(timings[stage])));
    table.append(row);
  }
  return table;
}
