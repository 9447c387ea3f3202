// The page: choose an image, ask, read the answer as it streams, follow up in the same session.
// A question is POST /v1/jobs (multipart: the image, or the session_id of a follow-up), its answer
// streams over WS /v1/jobs/{id}/stream, Stop is DELETE /v1/jobs/{id}. No framework, no build step.
import { request, whenKeyNeeded } from "./api.js";
import { fillGallery, ImagePicker } from "./image.js";
import { askForKey } from "./key_dialog.js";
import { StatusView } from "./status.js";
import { JobStream } from "./stream.js";
import { element, Turn } from "./thread.js";

const $ = (id) => document.getElementById(id);
const GENERIC_QUESTIONS = ["How many shapes are there?", "What colour is the star?", "What is written in the picture?"];

const state = { image: null, sessionId: null, current: null };

// --- errors: the server's own message, after what kind of problem it is ---
const KINDS = {
  0: "Cannot reach the server",
  401: "API key missing or wrong",
  403: "Not allowed",
  413: "Too large",
  415: "Not an image this service reads",
  422: "Invalid request",
  429: "The service is busy",
  503: "The service is unavailable",
};

export function describe(error) {
  let kind = KINDS[error.status] || (error.status === 400 ? "Cannot use this request" : "Error");
  if (error.status === 429 && error.retryAfter) kind += ` (try again in ${error.retryAfter} s)`;
  return `${kind}: ${error.message}`;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

const announce = (text) => ($("announce").textContent = text);

// --- asking ---
function formFor(prompt, withImage) {
  const form = new FormData();
  form.append("prompt", prompt);
  form.append("cancel_on_disconnect", "true"); // the page closed mid-answer: stop generating for nobody
  form.append("max_tokens", $("max-tokens").value || "64");
  if (Number($("min-tokens").value) > 0) form.append("min_tokens", $("min-tokens").value);
  if ($("ignore-eos").checked) form.append("ignore_eos", "true");
  if (Number($("temperature").value) > 0) form.append("temperature", $("temperature").value);
  if (state.sessionId) form.append("session_id", state.sessionId);
  if (withImage || !state.sessionId) form.append("image", state.image, state.image.name);
  return form;
}

async function submit(prompt) {
  try {
    return await request("/v1/jobs", { method: "POST", body: formFor(prompt, false) });
  } catch (err) {
    // the session's image expired on the server: send it again, the conversation carries on
    if (err.code !== "image_expired" || !state.image) throw err;
    return request("/v1/jobs", { method: "POST", body: formFor(prompt, true) });
  }
}

async function ask(prompt) {
  prompt = prompt.trim();
  if (!prompt) return showError("Type a question first.");
  if (state.current) return showError("Wait for the answer, or stop it, before asking again.");
  if (!state.image) return showError("Choose an image first, or start from an example.");
  clearError();
  const current = { turn: new Turn($("thread"), prompt), jobId: null, stopRequested: false, stream: null };
  state.current = current;
  setBusy(true);
  $("question").value = "";
  try {
    const job = await submit(prompt);
    if (state.current !== current) return cancel({ jobId: job.id }); // the image changed meanwhile
    state.sessionId = job.session_id;
    current.jobId = job.id;
    current.turn.accepted(job);
    follow(current, job.id);
    if (current.stopRequested) cancel(current);
  } catch (err) {
    if (state.current !== current) return;
    current.turn.remove();
    $("question").value = prompt;
    showError(describe(err));
    finish(current);
  }
}

function follow(current, jobId) {
  current.stream = new JobStream(jobId, {
    status: (status, attempt) => current.turn.status(status, attempt),
    token: (text, attempt) => current.turn.token(text, attempt),
    end: (event) => {
      announce(current.turn.end(event));
      finish(current);
    },
    fail: (error) => {
      current.turn.fail(describe(error));
      showError(describe(error));
      finish(current);
    },
  });
  current.stream.start();
}

function finish(current) {
  if (state.current === current) state.current = null;
  setBusy(false);
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

// --- stopping ---
function stop() {
  const current = state.current;
  if (!current || current.stopRequested) return;
  current.stopRequested = true;
  $("stop").disabled = true;
  current.turn.show("stopping", "Stopping…");
  if (current.jobId) cancel(current);
}

// The image changes mid-answer: the job is cancelled and its stream closed, nothing more shown.
function abandon() {
  const current = state.current;
  if (!current) return;
  if (current.jobId) cancel(current);
  if (current.stream) current.stream.close();
  finish(current);
}

function cancel(current) {
  request(`/v1/jobs/${current.jobId}`, { method: "DELETE" }).catch((err) => {
    if (err.status !== 409) showError(describe(err)); // 409: it had just finished
  });
}

// --- images and the conversation ---
function chooseImage(file, example) {
  abandon();
  state.image = file;
  state.sessionId = null;
  $("thread").replaceChildren();
  clearError();
  showSuggestions(example ? example.questions.map(([question]) => question) : GENERIC_QUESTIONS);
  $("question").focus();
}

function newImage(picker) {
  abandon();
  state.image = null;
  state.sessionId = null;
  picker.clear();
  $("thread").replaceChildren();
  $("suggestions").hidden = true;
  clearError();
  $("file").focus();
}

function showSuggestions(questions) {
  const list = $("suggestions").querySelector("ul");
  list.replaceChildren(
    ...questions.map((question) => {
      const button = element("button", { type: "button", class: "suggestion" }, question);
      button.addEventListener("click", () => ask(question));
      const item = element("li");
      item.append(button);
      return item;
    }),
  );
  $("suggestions").hidden = false;
}

function start() {
  whenKeyNeeded(askForKey);
  const picker = new ImagePicker(chooseImage);
  const status = new StatusView((model) => ($("model-name").textContent = model || "vlmq-tiny"));
  fillGallery(picker, (message) => showError(message));
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    ask($("question").value);
  });
  $("stop").addEventListener("click", stop);
  $("new-image").addEventListener("click", () => newImage(picker));
  $("key-button").addEventListener("click", () => askForKey(""));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.current && !$("key-dialog").open) stop();
  });
  status.loadModel(); // also asks for the key at once when the server wants one
}

start();
