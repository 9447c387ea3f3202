// Choosing the image: the file picker, drag and drop onto the drop zone, or an example from the
// gallery (served by the gateway under /examples/). The server checks the file when a question
// is asked; here a file the browser cannot show just gets no preview.
import { element } from "./thread.js";

const $ = (id) => document.getElementById(id);

export class ImagePicker {
  // onChoose(file, example): example is the gallery entry, or null for the user's own file
  constructor(onChoose) {
    this.onChoose = onChoose;
    this.previewUrl = null;
    $("file").addEventListener("change", () => this.fromPicker());
    this.setUpDrop($("drop"));
  }

  fromPicker() {
    const file = $("file").files[0];
    if (file) this.choose(file, null);
  }

  setUpDrop(zone) {
    for (const name of ["dragenter", "dragover"]) {
      zone.addEventListener(name, (event) => {
        event.preventDefault();
        zone.classList.add("dragging");
      });
    }
    zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("dragging");
      const file = event.dataTransfer.files[0];
      if (file) this.choose(file, null);
    });
  }

  async fromExample(example) {
    const response = await fetch(`/examples/${encodeURIComponent(example.file)}`);
    if (!response.ok) throw new Error(`example ${example.file}: ${response.status}`);
    const blob = await response.blob();
    this.choose(new File([blob], example.file, { type: blob.type }), example);
  }

  choose(file, example) {
    this.show(file, example ? example.alt : `Your image: ${file.name}`);
    this.onChoose(file, example);
  }

  show(file, description) {
    if (this.previewUrl) URL.revokeObjectURL(this.previewUrl);
    this.previewUrl = URL.createObjectURL(file);
    const preview = $("preview");
    const name = $("image-name");
    preview.hidden = false;
    preview.alt = description;
    preview.onerror = () => {
      preview.hidden = true;
      name.textContent = `${file.name}: no preview (the server checks the file when you ask)`;
    };
    preview.src = this.previewUrl;
    name.textContent = `${file.name} (${Math.ceil(file.size / 1024)} KB)`;
    name.hidden = false;
    $("drop-hint").classList.add("compact");
    $("new-image").hidden = false;
  }

  clear() {
    if (this.previewUrl) URL.revokeObjectURL(this.previewUrl);
    this.previewUrl = null;
    $("preview").hidden = true;
    $("preview").removeAttribute("src");
    $("image-name").hidden = true;
    $("drop-hint").classList.remove("compact");
    $("new-image").hidden = true;
    $("file").value = "";
  }
}

export async function fillGallery(picker, onError) {
  const list = $("gallery");
  let examples = [];
  try {
    examples = (await (await fetch("/static/examples.json")).json()).examples;
  } catch (err) {
    onError(`the example images could not be loaded (${err.message})`);
  }
  for (const example of examples) {
    const button = element("button", { type: "button", class: "example", "data-file": example.file });
    const thumb = element("img", { src: `/examples/${example.file}`, alt: "" });
    button.append(thumb, element("span", {}, example.file));
    button.setAttribute("aria-label", `Example ${example.file}: ${example.alt}`);
    button.addEventListener("click", () => picker.fromExample(example).catch((err) => onError(err.message)));
    const item = element("li");
    item.append(button);
    list.append(item);
  }
  return examples;
}
