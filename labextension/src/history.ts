/**
 * A session's history across preemptions, in words: "started 10:02, preempted 12:40 (node
 * drained: fan failure), restored 12:43 on h100-b", with each segment's cost and the total.
 * Times are the sidebar's clock times (its one zone, said once in its footer). Pure
 * functions, unit-tested directly.
 */
import type { ISessionHistory } from './api';
import { formatClock, formatGpuHours, IClockOptions } from './format';
import { toLocalMs } from './state';

export interface IHistoryView {
  /** One line: how the server started, stopped and came back ('' before it first started). */
  summary: string;
  /** Each segment: "10:02–12:40 on h100-a" and its cost. */
  segments: { label: string; cost: string }[];
  total: string;
}

export function historyView(
  h: ISessionHistory,
  offsetMs: number,
  nowMs: number,
  o: IClockOptions = {}
): IHistoryView {
  const clock = (epoch: number) => formatClock(toLocalMs(epoch, offsetMs), nowMs, o);
  const where = (nodes: string[]) => (nodes.length ? ` on ${nodes.join(', ')}` : '');
  const parts: string[] = [];
  h.segments.forEach((g, i) => {
    if (i === 0) {
      parts.push(`started ${clock(g.start)}`);
    } else {
      const came = h.segments[i - 1].ended === 'preempted' ? 'restored' : 'resumed';
      parts.push(`${came} ${clock(g.start)}${where(g.nodes)}`);
    }
    if (g.end !== null) {
      parts.push(`${g.ended ?? 'stopped'} ${clock(g.end)}${g.why ? ` (${g.why})` : ''}`);
    }
  });
  return {
    summary: parts.join(', '),
    segments: h.segments.map(g => ({
      label: `${clock(g.start)}–${g.end === null ? 'now' : clock(g.end)}${where(g.nodes)}`,
      cost: formatGpuHours(g.gpu_hours)
    })),
    total: formatGpuHours(h.total_gpu_hours)
  };
}
