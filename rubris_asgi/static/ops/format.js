// rubris ops page: small value helpers and number formatting (no DOM, no state).
//
// Server data are untrusted: these helpers turn anything that is not a finite number into 0 or
// "–", so a missing or malformed field shows as a dash, never as NaN.

export const isNum = (x) => typeof x === "number" && Number.isFinite(x);
export const num = (x) => (isNum(x) ? x : 0);
export const str = (x) => (x == null ? "" : String(x));
export const list = (x) => (Array.isArray(x) ? x : []);
export const dict = () => Object.create(null);
export const sum = (values) => values.reduce((a, b) => a + num(b), 0);

/** Three significant digits and a unit prefix: 1234 -> "1.23k", 0.5 -> "0.5". */
function fmtScaled(x, units, base) {
  if (!isNum(x)) return "–";
  let v = x;
  let i = 0;
  // Compare the rounded value so 999.7 becomes "1k", not "1000".
  while (Math.abs(Number(v.toPrecision(3))) >= base && i < units.length - 1) {
    v /= base;
    i += 1;
  }
  return `${Number(v.toPrecision(3))}${units[i]}`;
}

export const fmtNum = (x) => fmtScaled(x, ["", "k", "M", "G", "T"], 1000);
export const fmtRate = (x) => (isNum(x) ? `${fmtNum(x)}/s` : "–");
export const fmtBytes = (x) => fmtScaled(x, [" B", " kB", " MB", " GB", " TB"], 1000);
export const fmtByteRate = (x) => (isNum(x) ? `${fmtBytes(x)}/s` : "–");
export const fmtPct = (x) => (isNum(x) ? `${Number(x.toPrecision(x >= 100 ? 4 : 3))}%` : "–");

/** Whole counts are easier to compare with separators, until they get long. */
export const fmtCount = (x) =>
  !isNum(x) ? "–" : Math.abs(x) < 1e6 ? Math.round(x).toLocaleString("en-US") : fmtNum(x);

/** Seconds as milliseconds while under a second: 0.0123 -> "12.3 ms". */
export function fmtMs(s) {
  if (!isNum(s)) return "–";
  if (s === 0) return "0 ms";
  if (Math.abs(s) >= 1) return `${Number(s.toPrecision(3))} s`;
  const ms = s * 1000;
  return `${Number(ms.toPrecision(ms < 1 ? 2 : 3))} ms`;
}

/** Uptime style: "3d 4h", "2h 5m", "5m 3s", "42s". */
export function fmtDuration(s) {
  if (!isNum(s) || s < 0) return "–";
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = Math.floor(s % 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${sec}s`;
  return `${sec}s`;
}

export const fmtClock = (ms) => new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
