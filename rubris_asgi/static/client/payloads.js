// Payload bytes to values and back: topic payloads by the codec SUBSCRIBED announced, call
// arguments and results as JSON, and raw DEFLATE both ways (DecompressionStream), which the
// COMPRESSED flag means (§2). Separate from the codec because inflating is asynchronous and
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
