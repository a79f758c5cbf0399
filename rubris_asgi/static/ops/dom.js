// rubris ops page: DOM helpers. Strings always become text nodes (Element.append) or attribute
// values (setAttribute), never HTML, so text from the server (topic names, users, worker ids)
// cannot inject anything.

import { str } from "./format.js";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.filter((c) => c != null && c !== false));
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.filter((c) => c != null && c !== false));
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "text") node.textContent = str(value);
    else node.setAttribute(key, value === true ? "" : str(value));
  }
}
