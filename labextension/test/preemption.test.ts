import { describe, expect, it } from 'vitest';

import type { IServerSnapshots } from '../src/api';
import { forecastShort, forecastText, plainReason, stopNotice } from '../src/preemption';
import { ISnapshot } from '../src/state';
import { info, session, snapshotOf } from './fixtures';

const UTC = { timeZone: 'UTC' };
// the browser clock is 5 minutes behind the service's: epochs are shifted into browser time
const OFFSET = 5 * 60_000;
const T0 = Date.UTC(2026, 11, 6, 14, 0, 0); // browser ms: 14:00 UTC
const svc = (ms: number) => (ms + OFFSET) / 1000; // the service's epoch for a browser instant

function withSnapshots(snap: ISnapshot): ISnapshot {
  return {
    ...snap,
    info: info({ features: { usage_daily: false, job_log: false, snapshots: true } }),
    server: { enabled: true } as IServerSnapshots
  };
}

describe('the forecast while a preemption is likely', () => {
  const likely = session({
    protected_left_s: 300,
    preemption_forecast: {
      likely: true,
      at: svc(T0 + 20 * 60_000),
      for_workload: 'j9',
      for_project: 'astro',
      reason: "project astro's backed work is waiting for its GPUs"
    }
  });

  it('says when and why, and that the kernels come back', () => {
    const snap = withSnapshots(snapshotOf(likely, T0, OFFSET));
    expect(forecastText(snap, T0, UTC)).toBe(
      "May be preempted at ~14:20: project astro's backed work is waiting for its GPUs. " +
        'Your kernels will be saved and restored.'
    );
    expect(forecastShort(snap, T0, UTC)).toBe('may be preempted ~14:20');
  });

  it('asks to save the work where kernels are not saved', () => {
    expect(forecastText(snapshotOf(likely, T0, OFFSET), T0, UTC)).toMatch(
      /Save your work before then\.$/
    );
  });

  it('says nothing while nothing is likely, or once the preemption is asked for', () => {
    const none = session({ preemption_forecast: { likely: false, at: null } });
    expect(forecastText(snapshotOf(none, T0, OFFSET), T0, UTC)).toBeNull();
    expect(forecastText(snapshotOf(session(), T0, OFFSET), T0, UTC)).toBeNull();
    const asked = { ...likely, preempt_requested: 'node n1 is draining' };
    expect(forecastShort(snapshotOf(asked, T0, OFFSET), T0, UTC)).toBeNull();
    expect(forecastText(snapshotOf(null, T0, OFFSET), T0, UTC)).toBeNull();
  });
});

describe('the notice before the server stops', () => {
  const asked = session({
    preempt_requested: 'project astro stands above lattice-qcd (loses 0.28 GPU-h)',
    preempt_deadline: svc(T0 + 120_000),
    preempt_stop_at: svc(T0 + 60_000)
  });

  it('counts the time left down to the stop, in words, without the cost figure', () => {
    const snap = withSnapshots(snapshotOf(asked, T0, OFFSET));
    const n = stopNotice(snap, T0 + 8_000, UTC)!;
    expect(n.left).toBe(52);
    expect(n.sessionId).toBe('s1');
    expect(n.message).toBe(
      'This server stops in 52 s (14:01): project astro stands above lattice-qcd. Its kernels ' +
        'are saved first and restored when the session starts again. Save your notebooks, or ' +
        'save and release it now.'
    );
    expect(stopNotice(snap, T0 + 61_000, UTC)!.message).toMatch(/^This server is being stopped now/);
    expect(stopNotice(snap, T0 + 61_000, UTC)!.left).toBe(0);
  });

  it('is one notice per preemption, and none without a stop time', () => {
    const snap = snapshotOf(asked, T0, OFFSET);
    expect(stopNotice(snap, T0)!.key).toBe(stopNotice(snap, T0 + 5000)!.key);
    expect(stopNotice(snapshotOf({ ...asked, preempt_stop_at: null }, T0, OFFSET), T0)).toBeNull();
    expect(stopNotice(snapshotOf(session(), T0, OFFSET), T0)).toBeNull();
    expect(stopNotice(snapshotOf({ ...asked, state: 'preempted' }, T0, OFFSET), T0)).toBeNull();
  });

  it('drops only the trailing cost figure of a reason', () => {
    expect(plainReason('node n1 is draining')).toBe('node n1 is draining');
    expect(plainReason('unbacked work yields to backed work (loses 1.50 GPU-h)')).toBe(
      'unbacked work yields to backed work'
    );
    expect(plainReason(null)).toBe('');
  });
});
