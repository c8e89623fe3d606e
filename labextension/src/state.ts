/**
 * The state logic of the sidebar and status bar, pure: what phase this session is in, the
 * live countdown, the cost so far, the status-bar words and colour, the account chain, and
 * which notifications are due. Times: the service's epochs (seconds) are turned into the
 * browser's milliseconds with the clock offset measured at each refresh, and countdowns run
 * from the moment an answer arrived (`protected_left_s`), so a wrong browser clock does not
 * shift them.
 */
import type {
  IAccount,
  IEndedWorkload,
  IInfo,
  INotice,
  ISessionHistory,
  IServerSnapshots,
  ISession,
  ISnapshotList,
  IUsage,
  IUsageDaily,
  IWorkload
} from './api';
import {
  formatClock,
  formatDuration,
  formatGpuHours,
  formatRelative,
  IClockOptions,
  placementFraction
} from './format';
import { noticeToast } from './notices';
import { restoreLostSomething, restoreMessage } from './snapshots';

export interface ISettings {
  /** Seconds between refreshes from the service. */
  refreshInterval: number;
  /** Warn when this many minutes of protected time are left. */
  protectionWarningMinutes: number;
  /** Warn when a project or program has less than this share of its grant left (percent). */
  budgetWarningPercent: number;
  /** Show JupyterLab notifications. */
  notifications: boolean;
}

export const DEFAULT_SETTINGS: ISettings = {
  refreshInterval: 15,
  protectionWarningMinutes: 10,
  budgetWarningPercent: 10,
  notifications: true
};

/** Settings from the registry, each clamped to a sane range (bad values fall back). */
export function normalizeSettings(raw: Partial<Record<keyof ISettings, unknown>>): ISettings {
  const num = (v: unknown, d: number, lo: number, hi: number) =>
    typeof v === 'number' && Number.isFinite(v) ? Math.min(hi, Math.max(lo, v)) : d;
  return {
    refreshInterval: num(raw.refreshInterval, DEFAULT_SETTINGS.refreshInterval, 5, 3600),
    protectionWarningMinutes: num(
      raw.protectionWarningMinutes,
      DEFAULT_SETTINGS.protectionWarningMinutes,
      0,
      24 * 60
    ),
    budgetWarningPercent: num(raw.budgetWarningPercent, DEFAULT_SETTINGS.budgetWarningPercent, 0, 100),
    notifications:
      typeof raw.notifications === 'boolean' ? raw.notifications : DEFAULT_SETTINGS.notifications
  };
}

/** Everything one refresh learnt. */
export interface ISnapshot {
  /** Browser time (ms) when the answers arrived. */
  receivedAt: number;
  /** Service clock minus browser clock, in ms (add to browser time to get service time). */
  offsetMs: number;
  info: IInfo | null;
  session: ISession | null;
  /** The session's project first, then its parents up to the root. */
  chain: IAccount[];
  usage: IUsage | null;
  daily: IUsageDaily | null;
  /** My other running and queued work (this session excluded). */
  work: IWorkload[];
  /** My last ended work with what each cost (null: the service does not say). */
  ended: IEndedWorkload[] | null;
  notices: INotice[];
  /** This server's segments across preemptions and restores (null: not asked or no session). */
  history: ISessionHistory | null;
  /** This session's snapshots (when the service has them), and what this server can do. */
  snapshots: ISnapshotList | null;
  server: IServerSnapshots | null;
  /** Why the last refresh failed, in words (the previous figures are kept). */
  error: string | null;
}

export function emptySnapshot(now: number): ISnapshot {
  return {
    receivedAt: now,
    offsetMs: 0,
    info: null,
    session: null,
    chain: [],
    usage: null,
    daily: null,
    work: [],
    ended: null,
    notices: [],
    history: null,
    snapshots: null,
    server: null,
    error: null
  };
}

/** A service epoch (s) as a browser instant (ms). */
export function toLocalMs(epoch: number, offsetMs: number): number {
  return epoch * 1000 - offsetMs;
}

/** The account chain from `project` up to the root, from a flat list of visible accounts. */
export function accountChain(accounts: IAccount[], project: string | null): IAccount[] {
  const byName = new Map(accounts.map(a => [a.name, a]));
  const out: IAccount[] = [];
  let name: string | null = project;
  while (name && byName.has(name) && out.length < 64) {
    const a: IAccount = byName.get(name)!;
    out.push(a);
    name = a.parent;
  }
  return out;
}

export type Phase =
  | 'none' // this lab is not a gpubudget session (or the service is not configured)
  | 'queued'
  | 'protected'
  | 'ending' // protected, but less than the warning threshold left
  | 'unprotected'
  | 'preempting' // the scheduler asked for this session to stop
  | 'ended';

export interface ISessionView {
  phase: Phase;
  /** When protection ends (browser ms), or null if not protected. */
  protectedUntil: number | null;
  /** Seconds of protection left (0 when none). */
  protectedLeft: number;
  /** GPU-hours charged so far, live. */
  cost: number | null;
  /** Why it is unprotected, in words (unbacked, idle, protection over). */
  why: string | null;
}

export function sessionView(snap: ISnapshot, now: number, settings: ISettings): ISessionView {
  const s = snap.session;
  const none: ISessionView = {
    phase: 'none',
    protectedUntil: null,
    protectedLeft: 0,
    cost: null,
    why: null
  };
  if (!s) {
    return none;
  }
  const cost = costSoFar(s, snap, now);
  if (s.state === 'pending') {
    return { ...none, phase: 'queued', cost };
  }
  if (s.state !== 'running') {
    return { ...none, phase: 'ended', cost };
  }
  let until: number | null = null;
  if (s.backed && s.protected_left_s !== null && s.protected_left_s !== undefined) {
    until = snap.receivedAt + s.protected_left_s * 1000;
  }
  const left = until === null ? 0 : Math.max(0, (until - now) / 1000);
  let why: string | null = null;
  if (!s.backed) {
    why = "unbacked: the project's grant does not cover this session, so it was never protected";
  } else if (s.idle_reported) {
    why = `idle since ${formatClock(toLocalMs(s.idle_reported, snap.offsetMs), now)}: protection ended`;
  } else if (left <= 0) {
    why = 'its protected time is over';
  }
  let phase: Phase;
  if (s.preempt_requested) {
    phase = 'preempting';
  } else if (left <= 0) {
    phase = 'unprotected';
  } else if (left <= settings.protectionWarningMinutes * 60) {
    phase = 'ending';
  } else {
    phase = 'protected';
  }
  return { phase, protectedUntil: left > 0 ? until : null, protectedLeft: left, cost, why };
}

/**
 * GPU-hours charged so far: the service's figure when it gives one (extrapolated since the
 * answer while running), else the charging rule itself for a session's single interval:
 * slice fraction x time since it started.
 */
export function costSoFar(w: IWorkload, snap: ISnapshot, now: number): number | null {
  const running = w.state === 'running';
  const fraction = placementFraction(w.placement);
  if (typeof w.charged_gpu_hours === 'number') {
    const extra = running ? (fraction * Math.max(0, now - snap.receivedAt)) / 3600_000 : 0;
    return w.charged_gpu_hours + extra;
  }
  if (w.started_at === null || w.started_at === undefined) {
    return w.state === 'pending' ? 0 : null;
  }
  const end = running
    ? now
    : w.ended_at !== null && w.ended_at !== undefined
      ? toLocalMs(w.ended_at, snap.offsetMs)
      : null;
  if (end === null) {
    return null;
  }
  const start = toLocalMs(w.started_at, snap.offsetMs);
  return (fraction * Math.max(0, end - start)) / 3600_000;
}

export type Level = 'ok' | 'warn' | 'danger' | 'neutral';

export interface IStatus {
  text: string;
  level: Level;
  /** A full sentence for screen readers and the tooltip. */
  label: string;
}

/** The status-bar item: "protected 1h12m · 0.31 GPU-h", colour-coded. */
export function statusFor(
  snap: ISnapshot,
  now: number,
  settings: ISettings,
  clock: IClockOptions = {}
): IStatus | null {
  const v = sessionView(snap, now, settings);
  const s = snap.session;
  if (v.phase === 'none' || !s) {
    return null;
  }
  const cost = formatGpuHours(v.cost);
  switch (v.phase) {
    case 'queued': {
      const pos = s.queue_position ? ` #${s.queue_position}` : '';
      const at = s.predicted_start
        ? formatClock(toLocalMs(s.predicted_start, snap.offsetMs), now, clock)
        : null;
      return {
        text: `queued${pos}${at ? ` · starts ~${at}` : ''}`,
        level: 'neutral',
        label:
          'GPU session queued' +
          (s.queue_position ? `, position ${s.queue_position}` : '') +
          (at ? `, predicted start ${at}` : '')
      };
    }
    case 'protected':
    case 'ending': {
      const left = formatDuration(v.protectedLeft);
      return {
        text: `protected ${left} · ${cost}`,
        level: v.phase === 'ending' ? 'warn' : 'ok',
        label: `GPU session protected for ${left} more (until ${formatClock(v.protectedUntil!, now, clock)}); ${cost} used so far`
      };
    }
    case 'unprotected':
      return {
        text: `unprotected · ${cost}`,
        level: 'danger',
        label: `GPU session unprotected (${v.why}): it may be preempted when backed work needs this slice; ${cost} used so far`
      };
    case 'preempting':
      return {
        text: `being preempted · ${cost}`,
        level: 'danger',
        label: `This GPU session is being preempted (${s.preempt_requested}); save your work now`
      };
    default:
      return {
        text: `session ${s.state} · ${cost}`,
        level: 'neutral',
        label: `GPU session ${s.state}; ${cost} charged`
      };
  }
}

/** What is left of an account's grant, and whether that is below the warning threshold. */
export function grantLeft(
  a: IAccount,
  settings: ISettings
): { left: number | null; usedPct: number | null; low: boolean } {
  const g = a.effective_grant_hours;
  const u = a.usage_hours;
  if (g === null || u === null || g <= 0) {
    return { left: null, usedPct: null, low: false };
  }
  const left = g - u;
  return {
    left,
    usedPct: (u / g) * 100,
    low: left < (g * settings.budgetWarningPercent) / 100
  };
}

export interface INotify {
  /** Identifies the event: the same key is never shown twice in one page load. */
  key: string;
  type: 'info' | 'warning' | 'error' | 'success';
  message: string;
  /** Keep it open until dismissed. */
  sticky: boolean;
}

/**
 * Which notifications are due, comparing what was seen before with the new snapshot. Keeps
 * its memory (keys already shown, previous phase and work states) so each event is shown
 * once per page load.
 */
export class NoticeTracker {
  private shown = new Set<string>();
  private lastPhase: Phase | null = null;
  private lastWork = new Map<string, string>();
  private readonly since: number;

  /** `sinceEpoch`: service notices older than this (the page load) are history, not news. */
  constructor(sinceEpoch: number) {
    this.since = sinceEpoch;
  }

  check(snap: ISnapshot, now: number, settings: ISettings, clock: IClockOptions = {}): INotify[] {
    const out: INotify[] = [];
    const add = (n: INotify) => {
      if (!this.shown.has(n.key)) {
        this.shown.add(n.key);
        out.push(n);
      }
    };
    const s = snap.session;
    const v = sessionView(snap, now, settings);
    if (s) {
      if (v.phase === 'ending' && v.protectedUntil !== null) {
        add({
          key: `ending:${s.id}`,
          type: 'warning',
          sticky: false,
          message:
            `Protection of this GPU session ends ${formatRelative(v.protectedLeft)} ` +
            `(${formatClock(v.protectedUntil, now, clock)}). After that it may be preempted ` +
            'when backed work needs this slice.'
        });
      }
      if (
        v.phase === 'unprotected' &&
        (this.lastPhase === 'protected' || this.lastPhase === 'ending') &&
        !s.idle_reported
      ) {
        add({
          key: `over:${s.id}`,
          type: 'warning',
          sticky: true,
          message:
            'Protected time of this GPU session is over: it may now be preempted when ' +
            'backed work needs this slice. Save your work regularly.'
        });
      }
      if (s.state === 'running' && s.idle_reported) {
        add({
          key: `idle:${s.id}:${s.idle_reported}`,
          type: 'warning',
          sticky: true,
          message:
            `This GPU session was reported idle at ` +
            `${formatClock(toLocalMs(s.idle_reported, snap.offsetMs), now, clock)}: its ` +
            'protection ended and it may be preempted when backed work needs this slice.'
        });
      }
      if (s.state === 'running' && s.preempt_requested && typeof s.preempt_stop_at !== 'number') {
        // (with a notice time, warning.ts shows the time left and "Save and release now")
        const deadline =
          typeof s.preempt_deadline === 'number'
            ? toLocalMs(s.preempt_deadline, snap.offsetMs)
            : null;
        const when =
          deadline !== null
            ? `It will be stopped ${formatRelative((deadline - now) / 1000)} ` +
              `(${formatClock(deadline, now, clock)}) at the latest.`
            : 'It will be stopped shortly.';
        const saved =
          snap.info?.features.snapshots && snap.server?.enabled
            ? ' Its kernels are being saved first: the session is queued again and they are ' +
              'restored when it starts. Save your notebooks.'
            : ' Save your work now.';
        add({
          key: `preempt:${s.id}`,
          type: 'error',
          sticky: true,
          message: `Preemption scheduled for this GPU session (${s.preempt_requested}). ${when}${saved}`
        });
      }
      if (s.restored && s.restored.at >= this.since - 600) {
        add({
          key: `restored:${s.id}:${s.restored.at}`,
          type: restoreLostSomething(s.restored) ? 'warning' : 'success',
          sticky: restoreLostSomething(s.restored),
          message: restoreMessage(s.restored, now, snap.offsetMs)
        });
      }
    }
    for (const w of snap.work) {
      const before = this.lastWork.get(w.id);
      if (before === 'pending' && w.state === 'running') {
        add({
          key: `started:${w.id}`,
          type: 'success',
          sticky: false,
          message: `${w.kind === 'interactive' ? 'Session' : 'Job'} ${w.name || w.id} started.`
        });
      }
    }
    for (const n of snap.notices) {
      if (n.at < this.since || (s && n.workload === s.id && n.kind === 'idle')) {
        continue; // history, or this session's idle notice (shown above)
      }
      add({
        key: `notice:${n.kind}:${n.workload}:${n.at}`,
        type:
          n.kind === 'preempt' || n.kind === 'requeue' || n.kind === 'preempt-warning'
            ? 'warning'
            : 'info',
        sticky: n.kind === 'preempt-warning', // told ahead: it stays until read
        message: noticeToast(n)
      });
    }
    for (const a of snap.chain) {
      if (grantLeft(a, settings).low) {
        add({
          key: `low:${a.name}`,
          type: 'warning',
          sticky: false,
          message:
            `${a.project ? 'Project' : 'Program'} ${a.name} has less than ` +
            `${settings.budgetWarningPercent}% of its grant left in this window: new work ` +
            'may be unbacked (never protected, preempted first).'
        });
      }
    }
    this.lastPhase = v.phase;
    this.lastWork = new Map(snap.work.map(w => [w.id, w.state]));
    if (s) {
      this.lastWork.set(s.id, s.state);
    }
    return out;
  }
}

/**
 * Whether the lab should open a Launcher when it starts: the main area it restored holds
 * nothing but terminals (a layout left by an earlier visit) and no Launcher. An empty main
 * area gets JupyterLab's own Launcher; a restored notebook is left in front.
 */
export function needsLauncher(kinds: ('launcher' | 'terminal' | 'other')[]): boolean {
  return kinds.length > 0 && kinds.every(k => k === 'terminal');
}
