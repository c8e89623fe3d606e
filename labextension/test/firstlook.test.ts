import { describe, expect, it } from 'vitest';

import { formatClock, formatZone } from '../src/format';
import { needsLauncher } from '../src/state';

describe('one time format, its zone said once', () => {
  it('names the zone with its offset', () => {
    expect(formatZone('Europe/Berlin', 60)).toBe('Europe/Berlin (UTC+01:00)');
    expect(formatZone('America/St_Johns', -150)).toBe('America/St_Johns (UTC-02:30)');
    expect(formatZone('UTC', 0)).toBe('UTC');
    expect(formatZone(undefined, 330)).toBe('UTC+05:30');
  });
  it('writes clock times in 24 hours, whatever the locale would say', () => {
    const now = Date.UTC(2026, 11, 6, 12, 0);
    const t = Date.UTC(2026, 11, 6, 0, 55);
    expect(formatClock(t, now, { timeZone: 'UTC' })).toBe('00:55');
    expect(formatClock(t, now, { timeZone: 'UTC', locale: 'en-US' })).toBe('00:55');
  });
});

describe('the lab opens on a Launcher', () => {
  it('adds one in front of terminals restored alone', () => {
    expect(needsLauncher(['terminal', 'terminal'])).toBe(true);
  });
  it('leaves a layout with a Launcher, a notebook, or nothing (JupyterLab opens one)', () => {
    expect(needsLauncher(['terminal', 'launcher'])).toBe(false);
    expect(needsLauncher(['other', 'terminal'])).toBe(false);
    expect(needsLauncher([])).toBe(false);
  });
});
