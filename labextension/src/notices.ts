/**
 * A notice in words: its title, its body as the service wrote it, and its ids apart (shown
 * folded behind "details"). Pure functions, unit-tested directly. A service that sends no
 * title (an older one) gets the old line: name (project) was preempted — reason.
 */
import type { INotice } from './api';

function oldTitle(n: INotice): string {
  const what = `${n.name || n.workload} (${n.project})`;
  return n.kind === 'preempt' ? `${what} was preempted` : `${what}: ${n.kind}`;
}

/** The bold first line: the service's title, or name (project) and what happened. */
export function noticeTitle(n: INotice): string {
  return n.title ? n.title : oldTitle(n);
}

/** The body as written (what happened, why, what was saved, what to do). */
export function noticeBody(n: INotice): string {
  return n.body ?? n.reason ?? '';
}

/**
 * The ids as [name, value] pairs in the service's order, empty ones left out, and the time
 * (`at`, an epoch) too: the notice already shows it as a clock time.
 */
export function noticeDetails(n: INotice): [string, string][] {
  const d = n.details ?? { workload: n.workload };
  return Object.entries(d)
    .filter(([k, v]) => k !== 'at' && v !== null && v !== undefined && v !== '')
    .map(([k, v]) => [k, String(v)]);
}

/** The toast: the title alone (the body is in the sidebar). */
export function noticeToast(n: INotice): string {
  if (n.title) {
    return /[.!?]$/.test(n.title) ? n.title : `${n.title}.`;
  }
  if (n.kind === 'preempt') {
    return (
      `${oldTitle(n)}${n.reason ? `: ${n.reason}` : ''}` + (n.requeued ? '; it is queued again.' : '.')
    );
  }
  return `${n.name || n.workload} (${n.project}): ${n.reason || n.kind}`;
}
