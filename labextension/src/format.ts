/**
 * Words and numbers for people: durations, local clock times, GPU-hours, placements and
 * standing. Pure functions (no JupyterLab), so they are unit-tested directly.
 */
import type { IPlacementSlice } from './api';

/** Compact duration: 45s, 12m, 1h12m, 2d3h; with `seconds`: 12m05s, 1h12m05s. */
export function formatDuration(totalSeconds: number, seconds = false): string {
  if (!Number.isFinite(totalSeconds)) {
    return '–';
  }
  let s = Math.max(0, Math.floor(totalSeconds));
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  const two = (n: number) => String(n).padStart(2, '0');
  if (d > 0) {
    return h > 0 ? `${d}d${h}h` : `${d}d`;
  }
  if (h > 0) {
    return seconds ? `${h}h${two(m)}m${two(s)}s` : `${h}h${two(m)}m`;
  }
  if (m > 0) {
    return seconds ? `${m}m${two(s)}s` : `${m}m`;
  }
  return `${s}s`;
}

/** Spoken duration for relative times: "45 s", "12 min", "1 h 5 min", "2 days 3 h". */
export function spokenDuration(totalSeconds: number): string {
  const s = Math.max(0, Math.round(totalSeconds));
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.round(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const h = Math.floor(minutes / 60);
  const m = minutes % 60;
  if (h < 48) {
    return m ? `${h} h ${m} min` : `${h} h`;
  }
  const d = Math.floor(h / 24);
  const rh = h % 24;
  return rh ? `${d} days ${rh} h` : `${d} days`;
}

/** "in 12 min", "in 13 s", "3 min ago"; "just now" within 30 s past, "now" within 5 s. */
export function formatRelative(deltaSeconds: number): string {
  if (deltaSeconds < 0 && deltaSeconds > -30) {
    return 'just now';
  }
  if (Math.abs(deltaSeconds) < 5) {
    return 'now';
  }
  return deltaSeconds > 0
    ? `in ${spokenDuration(deltaSeconds)}`
    : `${spokenDuration(-deltaSeconds)} ago`;
}

export interface IClockOptions {
  locale?: string;
  timeZone?: string;
}

function parts(ms: number, o: IClockOptions): Record<string, string> {
  const fmt = new Intl.DateTimeFormat(o.locale ?? 'en-GB', {
    timeZone: o.timeZone,
    year: 'numeric',
    month: 'short',
    day: 'numeric',
    weekday: 'short',
    hour: '2-digit',
    minute: '2-digit',
    hourCycle: 'h23'
  });
  const out: Record<string, string> = {};
  for (const p of fmt.formatToParts(new Date(ms))) {
    out[p.type] = p.value;
  }
  return out;
}

/**
 * A local clock time for an instant (ms since the epoch): "14:05" today, "Tue 14:05" within
 * the coming or past 6 days, else "3 Nov 14:05".
 */
export function formatClock(ms: number, nowMs: number, o: IClockOptions = {}): string {
  const t = parts(ms, o);
  const n = parts(nowMs, o);
  const hm = `${t.hour}:${t.minute}`;
  const sameDay = t.year === n.year && t.month === n.month && t.day === n.day;
  if (sameDay) {
    return hm;
  }
  if (Math.abs(ms - nowMs) < 6 * 86400_000) {
    return `${t.weekday} ${hm}`;
  }
  return `${t.day} ${t.month} ${hm}`;
}

/**
 * The zone every time in the sidebar is written in, said once: "Europe/Berlin (UTC+01:00)",
 * "UTC". `offsetMinutes` is east of UTC (-Date.getTimezoneOffset()).
 */
export function formatZone(timeZone: string | undefined, offsetMinutes: number): string {
  if (!timeZone || timeZone === 'UTC' || timeZone === 'Etc/UTC') {
    return offsetMinutes === 0 ? 'UTC' : formatOffset(offsetMinutes);
  }
  return `${timeZone} (${formatOffset(offsetMinutes)})`;
}

function formatOffset(offsetMinutes: number): string {
  const a = Math.abs(offsetMinutes);
  const two = (n: number) => String(n).padStart(2, '0');
  return `UTC${offsetMinutes < 0 ? '-' : '+'}${two(Math.floor(a / 60))}:${two(a % 60)}`;
}

/** "14:05 (in 12 min)" */
export function formatWhen(ms: number, nowMs: number, o: IClockOptions = {}): string {
  return `${formatClock(ms, nowMs, o)} (${formatRelative((ms - nowMs) / 1000)})`;
}

/**
 * GPU-hours with sensible precision: 0.31, 12.4, 128; below 0.1 two significant digits
 * (0.0083: a few minutes on a MIG slice is never shown as "0.00", as if it were free).
 */
export function formatGpuHours(h: number | null | undefined): string {
  if (h === null || h === undefined || !Number.isFinite(h)) {
    return '–';
  }
  const a = Math.abs(h);
  if (a === 0) {
    return '0 GPU-h';
  }
  if (a < 0.000001) {
    return 'less than 0.000001 GPU-h';
  }
  const text =
    a < 0.1
      ? String(Number(h.toPrecision(2)))
      : a < 10
        ? h.toFixed(2)
        : a < 100
          ? h.toFixed(1)
          : h.toFixed(0);
  return `${text} GPU-h`;
}

/** Share of a GPU in words: "1 GPU", "2 GPUs", "1/7 of a GPU", "25% of a GPU". */
export function formatFraction(fraction: number, slices?: IPlacementSlice[] | null): string {
  if (fraction <= 0) {
    return 'no GPU';
  }
  if (Math.abs(fraction - Math.round(fraction)) < 1e-9) {
    const n = Math.round(fraction);
    return n === 1 ? '1 GPU' : `${n} GPUs`;
  }
  const mig = (slices ?? []).find(s => s.kind === 'mig' && s.profile);
  const m = mig?.profile ? /^(\d+)g\./.exec(mig.profile) : null;
  if (m && (slices ?? []).length === 1) {
    return `${m[1]}/7 of a GPU`;
  }
  return `${Math.round(fraction * 100)}% of a GPU`;
}

/** GPU fraction held by a placement (charged milli-GPUs / 1000). */
export function placementFraction(slices: IPlacementSlice[] | null | undefined): number {
  return (slices ?? []).filter(s => s.gpu >= 0).reduce((a, s) => a + (s.milli ?? 0), 0) / 1000;
}

function gpuList(gpus: number[]): string {
  const sorted = [...gpus].sort((a, b) => a - b);
  const run = sorted.every((g, i) => i === 0 || g === sorted[i - 1] + 1);
  if (sorted.length === 1) {
    return `GPU ${sorted[0]}`;
  }
  return run && sorted.length > 2
    ? `GPUs ${sorted[0]}–${sorted[sorted.length - 1]}`
    : `GPUs ${sorted.join(', ')}`;
}

/** What was given: "MIG 1g.10gb", "2 whole GPUs", "MPS share 25%", "CPU only". */
export function sliceName(slices: IPlacementSlice[] | null | undefined): string {
  const gpuSlices = (slices ?? []).filter(s => s.gpu >= 0);
  if (!gpuSlices.length) {
    return 'CPU only';
  }
  const whole = gpuSlices.filter(s => s.kind === 'gpu').length;
  const out: string[] = [];
  if (whole) {
    out.push(whole === 1 ? '1 whole GPU' : `${whole} whole GPUs`);
  }
  for (const s of gpuSlices) {
    if (s.kind === 'mig') {
      out.push(`MIG ${s.profile ?? '?'}`);
    } else if (s.kind === 'mps') {
      out.push(`MPS share ${Math.round((s.milli ?? 0) / 10)}%`);
    }
  }
  return out.join(' + ');
}

/** Where it runs: "h100-a GPU 6", "h100-b GPUs 0–7", "h100-a (no GPU)". */
export function placementWhere(slices: IPlacementSlice[] | null | undefined): string {
  const byNode = new Map<string, number[]>();
  for (const s of slices ?? []) {
    const gpus = byNode.get(s.node) ?? [];
    if (s.gpu >= 0 && !gpus.includes(s.gpu)) {
      gpus.push(s.gpu);
    }
    byNode.set(s.node, gpus);
  }
  return [...byNode]
    .map(([node, gpus]) => (gpus.length ? `${node} ${gpuList(gpus)}` : `${node} (no GPU)`))
    .join('; ');
}

/** "MIG 1g.10gb on h100-a GPU 6", "2 whole GPUs on h100-b GPUs 0, 1", "CPU only". */
export function describePlacement(slices: IPlacementSlice[] | null | undefined): string {
  if (!slices || !slices.length) {
    return 'CPU only';
  }
  return `${sliceName(slices)} on ${placementWhere(slices)}`;
}

/** The cluster worth naming: null where the service schedules one cluster ('default'). */
export function clusterName(cluster: string | null | undefined): string | null {
  return cluster && cluster !== 'default' ? cluster : null;
}

/** What a standing (usage / grant) means for the account's work. */
export function standingWords(standing: number | null | undefined): string {
  if (standing === null || standing === undefined || !Number.isFinite(standing)) {
    return 'no grant: its work is unbacked';
  }
  if (standing < 1) {
    return 'under its grant';
  }
  return 'grant used up: new work is unbacked';
}

/** "7 days", "1 day", "12 h": the usage window. */
export function formatWindow(seconds: number): string {
  if (seconds % 86400 === 0) {
    const d = seconds / 86400;
    return d === 1 ? '1 day' : `${d} days`;
  }
  return spokenDuration(seconds);
}
