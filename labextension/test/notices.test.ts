import { describe, expect, it } from 'vitest';

import type { INotice } from '../src/api';
import { noticeBody, noticeDetails, noticeTitle, noticeToast } from '../src/notices';

function notice(over: Partial<INotice> = {}): INotice {
  const body =
    'Your server (project lattice-qcd) was stopped to free its GPU slice. Its node is being ' +
    'drained: fan failure. Its kernels were saved first; it is back in the queue.';
  return {
    kind: 'requeue',
    workload: 's-7f3a',
    name: 'your server',
    project: 'lattice-qcd',
    at: 1000,
    reason: body,
    title: 'Your server (project lattice-qcd) was stopped: its node is being drained',
    body,
    cause: 'drain',
    details: { workload: 's-7f3a', at: 1000, node: 'h100-a', snapshot: 's-7f3a--18f-abc', decision: null },
    requeued: true,
    state: 'pending',
    ...over
  };
}

describe('a notice in words', () => {
  it('shows the title and the body as written, with no "kind:" prefix and no repetition', () => {
    const n = notice();
    expect(noticeTitle(n)).toBe('Your server (project lattice-qcd) was stopped: its node is being drained');
    expect(noticeBody(n)).toBe(n.body);
    expect(noticeTitle(n)).not.toMatch(/^requeue:/);
    expect(noticeBody(n)).not.toContain('your server (lattice-qcd)');
  });
  it('keeps the ids apart, in order, leaving out empty ones and the raw time', () => {
    expect(noticeDetails(notice())).toEqual([
      ['workload', 's-7f3a'],
      ['node', 'h100-a'],
      ['snapshot', 's-7f3a--18f-abc']
    ]);
    expect(noticeDetails(notice({ details: undefined }))).toEqual([['workload', 's-7f3a']]);
  });
  it('says the same in a toast: the title, not the ids', () => {
    expect(noticeToast(notice())).toBe('Your server (project lattice-qcd) was stopped: its node is being drained.');
  });
  it('still reads well from a service that sends no title (name, project and reason)', () => {
    const old = notice({ title: undefined, body: undefined, details: undefined, kind: 'preempt', name: 'train', project: 'astro', reason: 'backed work' });
    expect(noticeTitle(old)).toBe('train (astro) was preempted');
    expect(noticeBody(old)).toBe('backed work');
    expect(noticeToast(old)).toBe('train (astro) was preempted: backed work; it is queued again.');
  });
});
