import { describe, expect, it } from 'vitest';

import type { ISessionHistory } from '../src/api';
import { historyView } from '../src/history';

const T = (hh: number, mm: number) => Date.UTC(2026, 11, 6, hh, mm) / 1000;
const UTC = { timeZone: 'UTC' };

function drainedAndRestored(): ISessionHistory {
  const slice = (node: string) => [{ node, gpu: 0, kind: 'gpu', milli: 1000 }];
  return {
    session: 's2',
    computed_at: T(13, 43),
    segments: [
      {
        workload: 's1',
        start: T(10, 2),
        end: T(12, 40),
        ended: 'preempted',
        why: 'node drained: fan failure',
        placement: slice('h100-a'),
        nodes: ['h100-a'],
        gpu_hours: 158 / 60
      },
      {
        workload: 's2',
        start: T(12, 43),
        end: null,
        ended: null,
        why: null,
        placement: slice('h100-b'),
        nodes: ['h100-b'],
        gpu_hours: 1
      }
    ],
    total_gpu_hours: 158 / 60 + 1
  };
}

describe('a session keeps its history across preemptions', () => {
  it('reads as one line: started, preempted and why, restored where', () => {
    const v = historyView(drainedAndRestored(), 0, T(13, 43) * 1000, UTC);
    expect(v.summary).toBe(
      'started 10:02, preempted 12:40 (node drained: fan failure), restored 12:43 on h100-b'
    );
  });
  it('gives each segment its cost, and the total', () => {
    const v = historyView(drainedAndRestored(), 0, T(13, 43) * 1000, UTC);
    expect(v.segments).toEqual([
      { label: '10:02–12:40 on h100-a', cost: '2.63 GPU-h' },
      { label: '12:43–now on h100-b', cost: '1.00 GPU-h' }
    ]);
    expect(v.total).toBe('3.63 GPU-h');
  });
  it('writes times in the sidebar’s zone, shifted by the server clock’s offset', () => {
    const v = historyView(drainedAndRestored(), -60_000, T(13, 43) * 1000, { timeZone: 'Europe/Berlin' });
    expect(v.summary).toBe(
      'started 11:03, preempted 13:41 (node drained: fan failure), restored 13:44 on h100-b'
    );
  });
  it('says resumed, not restored, after a stop that was not a preemption; and how it ended', () => {
    const h = drainedAndRestored();
    h.segments[0] = { ...h.segments[0], ended: 'hibernated', why: 'idle' };
    h.segments[1] = { ...h.segments[1], end: T(13, 0), ended: 'ended', gpu_hours: 17 / 60 };
    const v = historyView(h, 0, T(13, 43) * 1000, UTC);
    expect(v.summary).toBe('started 10:02, hibernated 12:40 (idle), resumed 12:43 on h100-b, ended 13:00');
  });
  it('has nothing to say for a session that never started', () => {
    const v = historyView({ session: 's', computed_at: 0, segments: [], total_gpu_hours: 0 }, 0, 0, UTC);
    expect(v.summary).toBe('');
    expect(v.segments).toEqual([]);
  });
});
