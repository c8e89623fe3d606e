import { describe, expect, it } from 'vitest';

import {
  accountChain,
  costSoFar,
  DEFAULT_SETTINGS,
  grantLeft,
  normalizeSettings,
  NoticeTracker,
  sessionView,
  statusFor
} from '../src/state';
import { account, session, snapshotOf, workload } from './fixtures';

const S = DEFAULT_SETTINGS; // warn 10 min before protection ends
const UTC = { timeZone: 'UTC' };
// the browser clock is 5 minutes behind the service's: epochs must be shifted, countdowns not
const OFFSET = 5 * 60_000;
const AT = 2000 * 1000 - OFFSET; // browser ms when the answer (service time 2000 s) arrived

describe('sessionView: phases and the countdown', () => {
  it('counts protected time down from when the answer arrived, whatever the browser clock', () => {
    const snap = snapshotOf(session({ protected_left_s: 3600 }), AT, OFFSET);
    const v0 = sessionView(snap, AT, S);
    expect(v0.phase).toBe('protected');
    expect(v0.protectedLeft).toBe(3600);
    expect(v0.protectedUntil).toBe(AT + 3600_000);
    const later = sessionView(snap, AT + 50 * 60_000 + 1000, S); // 9m59s left
    expect(later.phase).toBe('ending');
    expect(later.protectedLeft).toBeCloseTo(599, 5);
    const over = sessionView(snap, AT + 3600_000 + 1, S);
    expect(over.phase).toBe('unprotected');
    expect(over.protectedUntil).toBeNull();
    expect(over.why).toBe('its protected time is over');
  });

  it('an unbacked session is unprotected from the start and says why', () => {
    const v = sessionView(snapshotOf(session({ backed: false, protected_left_s: null }), AT), AT, S);
    expect(v.phase).toBe('unprotected');
    expect(v.why).toMatch(/unbacked/);
  });

  it('an idle report ends protection', () => {
    const s = session({ idle_reported: 1990, protected_left_s: 0 });
    const v = sessionView(snapshotOf(s, AT, OFFSET), AT, S);
    expect(v.phase).toBe('unprotected');
    expect(v.why).toMatch(/^idle since/);
  });

  it('a preemption request wins over everything', () => {
    const s = session({ preempt_requested: 'preempted for backed work of astro' });
    expect(sessionView(snapshotOf(s, AT), AT, S).phase).toBe('preempting');
  });

  it('queued, ended and no session', () => {
    expect(sessionView(snapshotOf(session({ state: 'pending', started_at: null }), AT), AT, S).phase).toBe('queued');
    expect(sessionView(snapshotOf(session({ state: 'done' }), AT), AT, S).phase).toBe('ended');
    expect(sessionView(snapshotOf(null, AT), AT, S).phase).toBe('none');
  });

  it('uses the warning threshold from the settings', () => {
    const snap = snapshotOf(session({ protected_left_s: 20 * 60 }), AT);
    expect(sessionView(snap, AT, S).phase).toBe('protected');
    expect(sessionView(snap, AT, { ...S, protectionWarningMinutes: 30 }).phase).toBe('ending');
  });
});

describe('costSoFar', () => {
  it('is slice fraction x time since start, with the clock offset applied', () => {
    // started at service time 1000 s; now is service time 2000 + 3600 s -> 4600 s running
    const s = session({ started_at: 1000 });
    const snap = snapshotOf(s, AT, OFFSET);
    const now = AT + 3600_000;
    expect(costSoFar(s, snap, now)).toBeCloseTo((0.143 * 4600) / 3600, 9);
  });

  it("prefers the service's charged figure and runs it on while running", () => {
    const w = workload({ charged_gpu_hours: 2.5 }); // one whole GPU
    const snap = snapshotOf(null, AT);
    expect(costSoFar(w, snap, AT)).toBe(2.5);
    expect(costSoFar(w, snap, AT + 1800_000)).toBeCloseTo(3.0, 9);
    expect(costSoFar({ ...w, state: 'done' }, snap, AT + 1800_000)).toBe(2.5);
  });

  it('a queued workload has cost nothing; an ended one is charged to its end', () => {
    const snap = snapshotOf(null, AT);
    expect(costSoFar(workload({ state: 'pending', started_at: null }), snap, AT)).toBe(0);
    expect(costSoFar(workload({ state: 'done', started_at: 1000, ended_at: 1000 + 1800 }), snap, AT)).toBeCloseTo(0.5, 9);
  });
});

describe('statusFor: the status-bar words and colour', () => {
  it('reads "protected 1h12m · 0.31 GPU-h"', () => {
    // a whole GPU started 18m36s ago (0.31 GPU-h), 1h12m30s of protection left
    const s = session({
      placement: [{ node: 'h100-a', gpu: 0, kind: 'gpu', milli: 1000 }],
      started_at: 2000 - 1116,
      protected_left_s: 72 * 60 + 30
    });
    const st = statusFor(snapshotOf(s, AT, OFFSET), AT, S, UTC)!;
    expect(st.text).toBe('protected 1h12m · 0.31 GPU-h');
    expect(st.level).toBe('ok');
    expect(st.label).toMatch(/protected for 1h12m more/);
  });

  it('turns amber, then red', () => {
    const s = session({ protected_left_s: 300 });
    expect(statusFor(snapshotOf(s, AT), AT, S)!.level).toBe('warn');
    const after = statusFor(snapshotOf(s, AT), AT + 301_000, S)!;
    expect(after.level).toBe('danger');
    expect(after.text).toMatch(/^unprotected · /);
    expect(after.label).toMatch(/may be preempted when backed work needs this slice/);
  });

  it('shows the queue position and predicted start in local time', () => {
    const s = session({ state: 'pending', started_at: null, queue_position: 3, predicted_start: 2000 + 1800 });
    const st = statusFor(snapshotOf(s, AT, OFFSET), AT, S, UTC)!;
    // service 3800 s -> browser 3800 s - 5 min = 00:58:20 UTC
    expect(st.text).toBe('queued #3 · starts ~00:58');
    expect(st.label).toBe('GPU session queued, position 3, predicted start 00:58');
    expect(st.level).toBe('neutral');
  });

  it('is absent without a session', () => {
    expect(statusFor(snapshotOf(null, AT), AT, S)).toBeNull();
  });
});

describe('accounts', () => {
  it('walks from the project to the root', () => {
    const list = [
      account({ name: 'physics', parent: null, project: false }),
      account(),
      account({ name: 'astro', parent: 'physics' })
    ];
    expect(accountChain(list, 'lattice-qcd').map(a => a.name)).toEqual(['lattice-qcd', 'physics']);
    expect(accountChain(list, null)).toEqual([]);
    expect(accountChain(list, 'unknown')).toEqual([]);
  });

  it('survives a cycle in bad data', () => {
    const list = [account({ name: 'a', parent: 'b' }), account({ name: 'b', parent: 'a' })];
    expect(accountChain(list, 'a').length).toBeLessThanOrEqual(64);
  });

  it('computes what is left and flags a nearly used grant', () => {
    expect(grantLeft(account({ usage_hours: 12, effective_grant_hours: 60 }), S)).toEqual({
      left: 48,
      usedPct: 20,
      low: false
    });
    expect(grantLeft(account({ usage_hours: 57, effective_grant_hours: 60 }), S).low).toBe(true);
    expect(grantLeft(account({ effective_grant_hours: null }), S).left).toBeNull();
  });
});

describe('settings', () => {
  it('clamps and falls back', () => {
    expect(normalizeSettings({})).toEqual(DEFAULT_SETTINGS);
    expect(normalizeSettings({ refreshInterval: 1, protectionWarningMinutes: 'x', notifications: false })).toEqual({
      ...DEFAULT_SETTINGS,
      refreshInterval: 5,
      notifications: false
    });
  });
});

describe('NoticeTracker', () => {
  it('warns once when protection ends soon, then once when it is over', () => {
    const t = new NoticeTracker(0);
    const snap = snapshotOf(session({ protected_left_s: 11 * 60 }), AT);
    expect(t.check(snap, AT, S)).toEqual([]);
    const soon = t.check(snap, AT + 90_000, S, UTC);
    expect(soon.map(n => n.key)).toEqual(['ending:s1']);
    expect(soon[0].message).toMatch(/ends in 10 min/);
    expect(t.check(snap, AT + 120_000, S)).toEqual([]); // not twice
    const over = t.check(snap, AT + 11 * 60_000 + 1, S);
    expect(over.map(n => [n.key, n.type, n.sticky])).toEqual([['over:s1', 'warning', true]]);
    expect(t.check(snap, AT + 12 * 60_000, S)).toEqual([]);
  });

  it('does not claim protection just ended when the page loads on an unprotected session', () => {
    const t = new NoticeTracker(0);
    const snap = snapshotOf(session({ protected_left_s: 0 }), AT);
    expect(t.check(snap, AT, S)).toEqual([]);
  });

  it('tells about an idle report and a scheduled preemption with its grace time', () => {
    const t = new NoticeTracker(0);
    const s = session({
      idle_reported: 1990,
      protected_left_s: 0,
      preempt_requested: 'preempted for backed work of astro',
      preempt_deadline: 2000 + 240
    });
    const got = t.check(snapshotOf(s, AT, OFFSET), AT, S, UTC);
    expect(got.map(n => n.key)).toEqual(['idle:s1:1990', 'preempt:s1']);
    expect(got[1].type).toBe('error');
    expect(got[1].message).toMatch(/It will be stopped in 4 min \(00:32\)/);
    expect(t.check(snapshotOf(s, AT), AT + 1000, S)).toEqual([]);
  });

  it('announces my queued work starting, new notices (not history) and a low grant', () => {
    const t = new NoticeTracker(1500);
    const snap = snapshotOf(null, AT);
    snap.work = [workload({ id: 'j1', name: 'sweep-3', state: 'pending' })];
    snap.notices = [
      { kind: 'preempt', workload: 'old', name: '', project: 'astro', at: 1000, reason: '', requeued: false, state: 'preempted' },
      { kind: 'preempt', workload: 'j0', name: 'train', project: 'astro', at: 1900, reason: 'backed work', requeued: true, state: 'pending' }
    ];
    snap.chain = [account({ usage_hours: 58 })];
    const first = t.check(snap, AT, S);
    expect(first.map(n => n.key)).toEqual(['notice:preempt:j0:1900', 'low:lattice-qcd']);
    expect(first[0].message).toBe('train (astro) was preempted: backed work; it is queued again.');
    snap.work = [workload({ id: 'j1', name: 'sweep-3', state: 'running' })];
    const second = t.check(snap, AT + 15_000, S);
    expect(second.map(n => n.message)).toEqual(['Job sweep-3 started.']);
  });
});
