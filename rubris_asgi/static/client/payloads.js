// Payload bytes to values and back: topic payloads by the codec SUBSCRIBED announced, call
// arguments and results as JSON, raw DEFLATE both ways (DecompressionStream), which the
// COMPRESSED flag means (§2), and RFC 7386 merge patches, which a keyed topic's PATCH carries
// (§5b). Separate from the codec because inflating is asynchronous and
// happens at delivery, not while a frame is parsed.

import { Codec, EMPTY, utf8Decoder, utf8Encoder } from "./codec.js";

async function pipeBytes(bytes, transform) {
  const stream = new Blob([bytes]).stream().pipeThrough(transform);
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Raw DEFLATE (RFC 1951, no zlib header) as the COMPRESSED flag means it (§2). */
export function inflateRaw(bytes) {
  return pipeBytes(bytes, new DecompressionStream("deflate-raw"));
}

export function deflateRaw(bytes) {
  return pipeBytes(bytes, new CompressionStream("deflate-raw"));
}

/** Decode a topic payload by the codec SUBSCRIBED announced. */
export function decodePayload(codec, bytes) {
  switch (codec) {
    case Codec.JSON:
      return bytes.length ? JSON.parse(utf8Decoder.decode(bytes)) : undefined;
    case Codec.TEXT:
      return utf8Decoder.decode(bytes);
    default:
      // A copy, so a value the app keeps does not pin the whole received frame in memory.
      return bytes.slice();
  }
}

export function encodeJson(value) {
  // "no args" travels as an empty payload, like SUBSCRIBE's empty params (§4).
  return value === undefined ? EMPTY : utf8Encoder.encode(JSON.stringify(value));
}

export function decodeJson(bytes) {
  return bytes.length ? JSON.parse(utf8Decoder.decode(bytes)) : undefined;
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/**
 * `patch` applied to `target` by RFC 7386 (JSON merge patch), as a keyed topic's PATCH means it
 * (§5b): each member of the patch replaces the target's member of that name, except `null`,
 * which removes it, and an object, which is merged into the target's member (made an object
 * first if it was not); arrays and scalars replace whole, and a patch that is not an object
 * replaces the target. Nothing is changed in place: a new object is made wherever the patch
 * changes something, so a value the app kept from before still shows what it was.
 */
export function mergePatch(target, patch) {
  if (!isObject(patch)) return patch;
  const out = isObject(target) ? { ...target } : {};
  for (const name of Object.keys(patch)) {
    const value = patch[name];
    if (value === null) {
      delete out[name];
      continue;
    }
    // JSON.parse makes "__proto__" an own member; reading or assigning it as `out[name]` would
    // reach the prototype instead, so that one member goes through its own property.
    const held = Object.prototype.hasOwnProperty.call(out, name) ? out[name] : undefined;
    const merged = isObject(value) ? mergePatch(held, value) : value;
    if (name === "__proto__") {
      Object.defineProperty(out, name, {
        value: merged, writable: true, enumerable: true, configurable: true,
      });
    } else {
      out[name] = merged;
    }
  }
  return out;
}
