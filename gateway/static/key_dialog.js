// The API key dialog: opened by a 401 (with the server's message) or the "API key" button.
// Several requests refused at once share one dialog.
import { apiKey } from "./api.js";

const $ = (id) => document.getElementById(id);
let pending = null;

export function askForKey(reason) {
  if (!pending) {
    pending = showDialog(reason).finally(() => {
      pending = null;
    });
  }
  return pending;
}

function showDialog(reason) {
  const dialog = $("key-dialog");
  $("key-reason").textContent = reason
    ? `The server says: ${reason}. Enter the API key (make up prints one).`
    : "Enter the API key (make up prints one); leave it empty to forget the saved one.";
  $("key-input").value = apiKey.get();
  dialog.returnValue = ""; // Escape closes with no value: a cancel
  dialog.showModal();
  $("key-input").focus();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        const key = $("key-input").value.trim();
        if (dialog.returnValue !== "save") return resolve(false);
        if (key) apiKey.set(key);
        else apiKey.clear();
        resolve(Boolean(key));
      },
      { once: true },
    );
  });
}
