import { describe, expect, it } from 'vitest';

import type { IRestoreReport, ISnapshotSet } from '../src/api';
import {
  formatBytes,
  kernelWhere,
  methodWords,
  restoredWords,
  restoreLostSomething,
  restoreMessage,
  snapshotLine,
  unsavedWords
} from '../src/snapshots';
import { DEFAULT_SETTINGS, NoticeTracker } from '../src/state';
import { info, session, snapshotOf } from './fixtures';

function set(over: Partial<ISnapshotSet> = {}): ISnapshotSet {
  return {
    id: 's1--18f0000000a-abcdef',
    session: 's1',
    project: 'lattice-qcd',
    created_at: 1000,
    method: 'namespace',
    status: 'ok',
    problem: '',
    stored_bytes: 1_234_000_000,
    raw_bytes: 2_000_000_000,
    seconds: 3.2,
    reason: 'preempt',
    kernels: [
      {
        kernel_name: 'python3',
        notebooks: ['work/analysis.ipynb'],
        method: 'namespace',
        saved: true,
        error: null,
        variables: 7,
        unsaved: { handle: "cannot pickle '_io.TextIOWrapper' object" },
        raw_bytes: 2_000_000_000,
        stored_bytes: 1_234_000_000
      }
    ],
    saved: 1,
    count: 1,
    ...over
  };
}

function report(over: Partial<IRestoreReport> = {}): IRestoreReport {
  return {
    snapshot: 's1--18f0000000a-abcdef',
    asked: 's1--18f0000000a-abcdef',
    summary: '',
    kernels: [
      {
        kernel_name: 'python3',
        notebooks: ['work/analysis.ipynb'],
        method: 'namespace',
        everything: false,
        restored: ['big', 'frame', 'scaled'],
        recomputed: { squares: 'by replaying cell 9' },
        lost: { handle: "cannot pickle '_io.TextIOWrapper' object; cell 8 was not replayed" },
        notes: [],
        error: null
      }
    ],
    skipped: [],
    taken_at: 1000,
    error: null,
    at: 1100,
    ...over
  };
}

describe('snapshots in words', () => {
  it('sizes, methods and one line per snapshot in local time', () => {
    expect(formatBytes(1_234_000_000)).toBe('1.2 GB');
    expect(formatBytes(340_000_000)).toBe('340 MB');
    expect(formatBytes(512)).toBe('512 B');
    expect(methodWords('criu+namespace')).toBe('CRIU + namespace');
    expect(methodWords('none')).toBe('nothing saved');
    // created at service epoch 1000 s, no clock offset, "now" the same day
    const line = snapshotLine(set(), 1000 * 1000 + 60_000, 0);
    expect(line).toMatch(/^\d\d:\d\d · 1\.2 GB · namespace · 1 of 1 kernel · before a preemption$/);
    expect(snapshotLine(set({ count: 0, saved: 0, method: 'none', reason: 'user' }), 1e6, 0))
      .toContain('no kernels were running · on request');
  });

  it('names what could not be saved, and kernels that were not saved at all', () => {
    const s = set({
      kernels: [
        set().kernels[0],
        { ...set().kernels[0], notebooks: ['b.ipynb'], saved: false, error: 'busy', unsaved: {} }
      ]
    });
    expect(unsavedWords(s)).toEqual([
      "handle (cannot pickle '_io.TextIOWrapper' object)",
      'kernel python3 of b.ipynb: busy'
    ]);
  });

  it('says how each kernel came back: everything, or restored, recomputed and lost', () => {
    const k = report().kernels[0];
    expect(kernelWhere(k)).toBe('analysis.ipynb');
    expect(restoredWords(k)).toBe('3 variables restored; recomputed squares; lost handle');
    expect(restoredWords({ ...k, everything: true, method: 'criu' })).toContain('everything');
    expect(restoredWords({ ...k, error: 'not saved: busy' })).toBe('lost: not saved: busy');
    expect(restoreLostSomething(report())).toBe(true);
    expect(restoreLostSomething(report({ kernels: [{ ...k, lost: {} }] }))).toBe(false);
  });

  it('the restore notification says when it was taken and a skipped bad snapshot', () => {
    const msg = restoreMessage(
      report({ skipped: [{ id: 'x', problem: 'chunk 1a2b is missing' }] }),
      1e6,
      0
    );
    expect(msg).toMatch(/^Your kernels were restored from the snapshot taken at \d\d:\d\d/);
    expect(msg).toContain('was not used: chunk 1a2b is missing');
    expect(msg).toContain('analysis.ipynb: 3 variables restored; recomputed squares; lost handle');
    expect(restoreMessage(report({ kernels: [], error: 'no snapshot verifies' }), 1e6, 0)).toBe(
      'Your kernels could not be restored: no snapshot verifies'
    );
  });
});

describe('NoticeTracker: snapshots', () => {
  it('tells once what a restore brought back, as a warning when something was lost', () => {
    const t = new NoticeTracker(1100);
    const snap = snapshotOf(session({ restored: report() }), 1_100_000);
    const n = t.check(snap, 1_100_000, DEFAULT_SETTINGS).find(x => x.key.startsWith('restored:'));
    expect(n?.type).toBe('warning');
    expect(n?.sticky).toBe(true);
    expect(n?.message).toContain('lost handle');
    const again = t.check(snap, 1_101_000, DEFAULT_SETTINGS);
    expect(again.some(x => x.key.startsWith('restored:'))).toBe(false);
    const k = { ...report().kernels[0], lost: {} };
    const clean = new NoticeTracker(1100).check(
      snapshotOf(session({ restored: report({ kernels: [k] }) }), 1_100_000),
      1_100_000,
      DEFAULT_SETTINGS
    );
    expect(clean.find(x => x.key.startsWith('restored:'))?.type).toBe('success');
  });

  it('an old restore (long before the page loaded) is not news', () => {
    const t = new NoticeTracker(5000);
    const snap = snapshotOf(session({ restored: report({ at: 1000 }) }), 5_000_000);
    const out = t.check(snap, 5_000_000, DEFAULT_SETTINGS);
    expect(out.some(x => x.key.startsWith('restored:'))).toBe(false);
  });

  it('a preemption notice says the kernels are saved first when the server can', () => {
    const s = session({ preempt_requested: 'backed work needs this slice', preempt_deadline: 1200 });
    const features = { usage_daily: false, job_log: false, snapshots: true };
    const base = { ...snapshotOf(s, 1_100_000), info: info({ features }) };
    const server = { session: 's1', enabled: true, problem: null, methods: ['criu'], kernels: 1,
                     taking: false };
    const withSnap = new NoticeTracker(1000).check({ ...base, server }, 1_100_000, DEFAULT_SETTINGS);
    expect(withSnap.find(x => x.key.startsWith('preempt:'))?.message).toContain(
      'Its kernels are being saved first'
    );
    const without = new NoticeTracker(1000).check(base, 1_100_000, DEFAULT_SETTINGS);
    expect(without.find(x => x.key.startsWith('preempt:'))?.message).toContain('Save your work now.');
  });
});
