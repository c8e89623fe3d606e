import { describe, expect, it } from 'vitest';

import {
  clusterName,
  describePlacement,
  formatClock,
  formatDuration,
  formatFraction,
  formatGpuHours,
  formatRelative,
  formatWhen,
  formatWindow,
  placementFraction,
  placementWhere,
  sliceName,
  spokenDuration,
  standingWords
} from '../src/format';

const UTC = { timeZone: 'UTC' };
// 2026-11-03 (a Tuesday) 14:05:00 UTC
const T = Date.UTC(2026, 10, 3, 14, 5, 0);

describe('formatDuration', () => {
  it('is compact and never shows seconds unless asked', () => {
    expect(formatDuration(45)).toBe('45s');
    expect(formatDuration(12 * 60 + 5)).toBe('12m');
    expect(formatDuration(12 * 60 + 5, true)).toBe('12m05s');
    expect(formatDuration(3600 + 12 * 60 + 59)).toBe('1h12m');
    expect(formatDuration(3600 + 5 * 60, true)).toBe('1h05m00s');
    expect(formatDuration(2 * 86400 + 3 * 3600 + 7)).toBe('2d3h');
    expect(formatDuration(86400)).toBe('1d');
  });

  it('clamps negative and rounds down fractions', () => {
    expect(formatDuration(-5)).toBe('0s');
    expect(formatDuration(59.99)).toBe('59s');
    expect(formatDuration(Number.NaN)).toBe('–');
  });
});

describe('relative and clock times', () => {
  it('speaks durations', () => {
    expect(spokenDuration(30)).toBe('30 s');
    expect(spokenDuration(12 * 60)).toBe('12 min');
    expect(spokenDuration(65 * 60)).toBe('1 h 5 min');
    expect(spokenDuration(3 * 86400 + 2 * 3600)).toBe('3 days 2 h');
  });

  it('says in / ago / now', () => {
    expect(formatRelative(12 * 60)).toBe('in 12 min');
    expect(formatRelative(-3 * 60)).toBe('3 min ago');
    expect(formatRelative(13)).toBe('in 13 s');
    expect(formatRelative(3)).toBe('now');
    expect(formatRelative(-10)).toBe('just now');
  });

  it('shows a 24-hour local clock, with the weekday or date when not today', () => {
    expect(formatClock(T, T, UTC)).toBe('14:05');
    expect(formatClock(T + 86400_000, T, UTC)).toBe('Wed 14:05');
    expect(formatClock(T + 10 * 86400_000, T, UTC)).toBe('13 Nov 14:05');
    // the viewer's zone decides the hour and the day
    expect(formatClock(T, T, { timeZone: 'Asia/Tokyo' })).toBe('23:05');
    expect(formatClock(T + 2 * 3600_000, T, { timeZone: 'Asia/Tokyo' })).toBe('Wed 01:05');
    expect(formatWhen(T + 12 * 60_000, T, UTC)).toBe('14:17 (in 12 min)');
  });
});

describe('GPU-hours and slices', () => {
  it('rounds GPU-hours sensibly', () => {
    expect(formatGpuHours(0.3149)).toBe('0.31 GPU-h');
    expect(formatGpuHours(12.44)).toBe('12.4 GPU-h');
    expect(formatGpuHours(128.4)).toBe('128 GPU-h');
    expect(formatGpuHours(null)).toBe('–');
  });

  it('shows a few minutes on a slice precisely, never as free', () => {
    // 3.5 min on 1/7 of a GPU
    expect(formatGpuHours((3.5 / 60) * (143 / 1000))).toBe('0.0083 GPU-h');
    expect(formatGpuHours(0.05)).toBe('0.05 GPU-h');
    expect(formatGpuHours(0.00006)).toBe('0.00006 GPU-h');
    expect(formatGpuHours(0)).toBe('0 GPU-h');
    expect(formatGpuHours(1e-9)).toBe('less than 0.000001 GPU-h');
  });

  const mig = [{ node: 'h100-a', gpu: 6, kind: 'mig', milli: 143, profile: '1g.10gb', mig_start: 0 }];
  const two = [
    { node: 'h100-b', gpu: 0, kind: 'gpu', milli: 1000 },
    { node: 'h100-b', gpu: 1, kind: 'gpu', milli: 1000 }
  ];
  const mps = [{ node: 'h100-a', gpu: 3, kind: 'mps', milli: 250 }];
  const cpu = [{ node: 'h100-a', gpu: -1, kind: 'cpu', milli: 0 }];

  it('sums the charged fraction of a placement', () => {
    expect(placementFraction(mig)).toBeCloseTo(0.143);
    expect(placementFraction(two)).toBe(2);
    expect(placementFraction(cpu)).toBe(0);
    expect(placementFraction(null)).toBe(0);
  });

  it('describes what a session was given and where it runs', () => {
    expect(describePlacement(mig)).toBe('MIG 1g.10gb on h100-a GPU 6');
    expect(describePlacement(two)).toBe('2 whole GPUs on h100-b GPUs 0, 1');
    expect(describePlacement(mps)).toBe('MPS share 25% on h100-a GPU 3');
    expect(describePlacement(cpu)).toBe('CPU only on h100-a (no GPU)');
    expect(describePlacement([two[0]])).toBe('1 whole GPU on h100-b GPU 0');
    expect(describePlacement(null)).toBe('CPU only');
    const eight = [...Array(8).keys()].map(g => ({ node: 'h100-b', gpu: g, kind: 'gpu', milli: 1000 }));
    expect(describePlacement(eight)).toBe('8 whole GPUs on h100-b GPUs 0–7');
    const gang = [...two, { node: 'h100-c', gpu: 3, kind: 'gpu', milli: 1000 }];
    expect(sliceName(gang)).toBe('3 whole GPUs');
    expect(placementWhere(gang)).toBe('h100-b GPUs 0, 1; h100-c GPU 3');
  });

  it('names the share of a GPU', () => {
    expect(formatFraction(0.143, mig)).toBe('1/7 of a GPU');
    expect(formatFraction(2, two)).toBe('2 GPUs');
    expect(formatFraction(1)).toBe('1 GPU');
    expect(formatFraction(0.25, mps)).toBe('25% of a GPU');
    expect(formatFraction(0)).toBe('no GPU');
  });
});

describe('standing and window', () => {
  it('explains a standing in words', () => {
    expect(standingWords(0.2)).toBe('under its grant');
    expect(standingWords(1.0)).toMatch(/unbacked/);
    expect(standingWords(null)).toMatch(/^no grant/);
  });

  it('names the window', () => {
    expect(formatWindow(7 * 86400)).toBe('7 days');
    expect(formatWindow(86400)).toBe('1 day');
    expect(formatWindow(12 * 3600)).toBe('12 h');
  });
});

describe('cluster', () => {
  it('names a cluster only where there are several', () => {
    expect(clusterName('hpc')).toBe('hpc');
    expect(clusterName('default')).toBeNull();
    expect(clusterName(null)).toBeNull();
    expect(clusterName(undefined)).toBeNull();
    expect(clusterName('')).toBeNull();
  });
});
