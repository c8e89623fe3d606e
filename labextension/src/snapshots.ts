/**
 * Snapshots in words: what a snapshot saved, what a restore brought back and how. Pure
 * functions (no JupyterLab), unit-tested directly.
 */
import type { IRestoredKernel, IRestoreReport, ISnapshotSet } from './api';
import { formatClock } from './format';

/** A service epoch (s) as a browser instant (ms); as state.ts's toLocalMs. */
function localMs(epoch: number, offsetMs: number): number {
  return epoch * 1000 - offsetMs;
}

/** 1.2 GB, 340 MB, 12 kB, 512 B. */
export function formatBytes(n: number | null | undefined): string {
  const v = Math.max(0, n ?? 0);
  for (const [unit, k] of [
    ['GB', 1e9],
    ['MB', 1e6],
    ['kB', 1e3]
  ] as const) {
    if (v >= k) {
      return `${(v / k).toFixed(v / k < 10 ? 1 : 0)} ${unit}`;
    }
  }
  return `${v} B`;
}

/** "CRIU" / "namespace" / "CRIU + namespace" / "nothing saved". */
export function methodWords(method: string | null | undefined): string {
  if (!method || method === 'none') {
    return 'nothing saved';
  }
  return method
    .split('+')
    .map(m => (m === 'criu' ? 'CRIU' : m))
    .join(' + ');
}

const WHY: Record<string, string> = {
  user: 'on request',
  preempt: 'before a preemption',
  hibernate: 'when it hibernated'
};

/** One line for a snapshot: "14:05 · 1.2 GB · CRIU · 2 of 2 kernels · before a preemption". */
export function snapshotLine(s: ISnapshotSet, now: number, offsetMs: number): string {
  const parts = [
    formatClock(localMs(s.created_at, offsetMs), now),
    formatBytes(s.stored_bytes),
    methodWords(s.method)
  ];
  if (s.count !== null && s.count !== undefined) {
    parts.push(
      s.count === 0
        ? 'no kernels were running'
        : `${s.saved ?? 0} of ${s.count} kernel${s.count === 1 ? '' : 's'}`
    );
  }
  if (s.reason && WHY[s.reason]) {
    parts.push(WHY[s.reason]);
  }
  return parts.join(' · ');
}

/** Variables a snapshot could not save, with why: "handle (cannot pickle ...)". */
export function unsavedWords(s: ISnapshotSet): string[] {
  const out: string[] = [];
  for (const k of s.kernels ?? []) {
    for (const [name, why] of Object.entries(k.unsaved ?? {})) {
      out.push(`${name} (${why})`);
    }
    if (!k.saved && k.error) {
      out.push(`kernel ${k.kernel_name} of ${k.notebooks.join(', ') || 'no notebook'}: ${k.error}`);
    }
  }
  return out;
}

function baseName(path: string): string {
  const i = path.lastIndexOf('/');
  return i >= 0 ? path.slice(i + 1) : path;
}

/** Where a kernel served: "analysis.ipynb, model.ipynb" or its kernel name. */
export function kernelWhere(k: { notebooks: string[]; kernel_name: string }): string {
  return k.notebooks.length ? k.notebooks.map(baseName).join(', ') : `kernel ${k.kernel_name}`;
}

/** How one kernel came back. */
export function restoredWords(k: IRestoredKernel): string {
  if (k.error) {
    return `lost: ${k.error}`;
  }
  if (k.everything) {
    return 'everything, as it was (CRIU: the kernel process itself)';
  }
  const parts = [`${k.restored.length} variable${k.restored.length === 1 ? '' : 's'} restored`];
  const recomputed = Object.keys(k.recomputed ?? {});
  if (recomputed.length) {
    parts.push(`recomputed ${recomputed.sort().join(', ')}`);
  }
  const lost = Object.keys(k.lost ?? {});
  if (lost.length) {
    parts.push(`lost ${lost.sort().join(', ')}`);
  }
  return parts.join('; ');
}

/** Whether a restore lost anything the user had. */
export function restoreLostSomething(r: IRestoreReport): boolean {
  return (
    !!r.error ||
    r.kernels.some(k => !!k.error || Object.keys(k.lost ?? {}).length > 0)
  );
}

/** The notification after a restore: what came back, how, and what did not. */
export function restoreMessage(r: IRestoreReport, now: number, offsetMs: number): string {
  if (r.error && !r.kernels.length) {
    return `Your kernels could not be restored: ${r.error}`;
  }
  const when =
    r.taken_at !== null && r.taken_at !== undefined
      ? ` taken at ${formatClock(localMs(r.taken_at, offsetMs), now)}`
      : '';
  const kernels = r.kernels.length
    ? r.kernels.map(k => `${kernelWhere(k)}: ${restoredWords(k)}`).join('. ')
    : 'no kernels were running';
  const skipped = r.skipped?.length
    ? ` (the newest snapshot failed verification and was not used: ${r.skipped[0].problem})`
    : '';
  return `Your kernels were restored from the snapshot${when}${skipped}. ${kernels}.`;
}
