// The portal's shared scripts (no build step). The job page's live state, chart and log, and the
// jobs list's live rows: static/live.js.
