/**
 * Warned ahead of a preemption, in words (pure: no JupyterLab here, tested without it).
 *
 * - the forecast: while the service says this session is likely to be preempted ("may be
 *   preempted at ~14:20 — your kernels will be saved and restored"), in the sidebar and the
 *   status bar;
 * - the stop notice: once the scheduler asked for the session, the server is stopped at the
 *   session's `preempt_stop_at` (the service's notice time); until then the lab shows the
 *   time left and "Save and release now" (warning.ts).
 */
import { ISession } from './api';
import { formatClock, IClockOptions } from './format';
import { ISnapshot, toLocalMs } from './state';

/** Whether this server's kernels are saved before a preemption and restored after. */
function kernelsSaved(snap: ISnapshot): boolean {
  return Boolean(snap.info?.features.snapshots && snap.server?.enabled);
}

/** The core's reason without its cost figure: "node n1 is draining". */
export function plainReason(reason: string | null | undefined): string {
  return (reason ?? '').replace(/\s*\(loses [0-9.]+ GPU-h\)\s*$/, '').trim();
}

/** When the session is likely to be preempted (browser ms), or null. */
export function forecastAt(s: ISession | null, snap: ISnapshot): number | null {
  const f = s?.preemption_forecast;
  if (!s || s.state !== 'running' || s.preempt_requested || !f?.likely || f.at === null) {
    return null;
  }
  return toLocalMs(f.at, snap.offsetMs);
}

/**
 * "May be preempted at ~14:20: project lattice's backed work is waiting for its GPUs. Your
 * kernels will be saved and restored." — or null while nothing is likely.
 */
export function forecastText(snap: ISnapshot, now: number, clock: IClockOptions = {}): string | null {
  const s = snap.session;
  const at = forecastAt(s, snap);
  if (at === null || !s) {
    return null;
  }
  const why = s.preemption_forecast?.reason;
  return (
    `May be preempted at ~${formatClock(at, now, clock)}` +
    (why ? `: ${why}.` : '.') +
    (kernelsSaved(snap)
      ? ' Your kernels will be saved and restored.'
      : ' Save your work before then.')
  );
}

/** The short form for the status bar: "may be preempted ~14:20". */
export function forecastShort(snap: ISnapshot, now: number, clock: IClockOptions = {}): string | null {
  const at = forecastAt(snap.session, snap);
  return at === null ? null : `may be preempted ~${formatClock(at, now, clock)}`;
}

export interface IStopNotice {
  /** The session being preempted. */
  sessionId: string;
  /** One notice per preemption. */
  key: string;
  /** When the server stops (browser ms). */
  stopAt: number;
  /** Whole seconds left. */
  left: number;
  message: string;
}

/** The warning before the server stops, with the time left; null when none is due. */
export function stopNotice(snap: ISnapshot, now: number, clock: IClockOptions = {}): IStopNotice | null {
  const s = snap.session;
  if (!s || s.state !== 'running' || !s.preempt_requested || typeof s.preempt_stop_at !== 'number') {
    return null;
  }
  const stopAt = toLocalMs(s.preempt_stop_at, snap.offsetMs);
  const left = Math.max(0, Math.ceil((stopAt - now) / 1000));
  const why = plainReason(s.preempt_requested);
  const saved = kernelsSaved(snap)
    ? 'Its kernels are saved first and restored when the session starts again.'
    : 'Kernel state is not saved: save your work.';
  const when =
    left > 0
      ? `This server stops in ${left} s (${formatClock(stopAt, now, clock)})`
      : 'This server is being stopped now';
  return {
    sessionId: s.id,
    key: `${s.id}:${s.preempt_deadline ?? ''}`,
    stopAt,
    left,
    message:
      `${when}: ${why || 'preempted'}. ${saved}` +
      (left > 0 ? ' Save your notebooks, or save and release it now.' : '')
  };
}
