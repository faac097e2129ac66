// ms_exporter's small canvas line chart: no dependencies, used by the live page and the run report.
// drawChart(canvas, {series: [{name, color, xs, ys}], markers: [{x, color, title}], bands: [{from, to, color, label}],
//                    bound: {max|min: value}, unit, logY, zero, clipAbove, xRange}) draws every series on shared axes
// and returns the number of points drawn. unit "bytes" labels the axis in binary units (KiB, MiB, GiB: as
// `ms-exporter top`); zero starts the axis at 0; clipAbove caps the axis there and draws the points above it as
// triangles on the top edge (the compile step, which would flatten every other step time); bands shade the steps
// from..to (non-finite losses) with their label on top; xRange widens the x axis to at least that range.
// The canvas's data-* attributes say what was drawn (points, markers and bands in the range, the y tick labels):
// what the browser tests read.
"use strict";
(function (global) {
  const PAD = {left: 56, right: 10, top: 10, bottom: 24};

  function finite(v) { return v !== null && v !== undefined && Number.isFinite(v); }

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) { hi = lo + 1; }
    const raw = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || 10 * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) { ticks.push(t); }
    return ticks;
  }

  function format(v) {
    const a = Math.abs(v);
    if (a === 0) { return "0"; }
    if (Number.isInteger(v) && a < 1e4) { return String(v); }
    if (a >= 1e9) { return (v / 1e9).toFixed(1) + "G"; }
    if (a >= 1e6) { return (v / 1e6).toFixed(1) + "M"; }
    if (a >= 1e4) { return (v / 1e3).toFixed(0) + "k"; }
    if (a >= 100) { return v.toFixed(0); }
    if (a >= 1) { return v.toFixed(2); }
    return v.toPrecision(2);
  }

  function formatBytes(v) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i === 0 ? v.toFixed(0) + "B" : v.toFixed(1) + units[i];
  }

  function distinct(texts) { return texts.every((text, i) => i === 0 || text !== texts[i - 1]); }

  // Axis labels for `ticks`: one unit and one number of decimals for all of them, as many as the spacing of evenly
  // spaced ticks needs (1.5, not 2; 0.00100, 0.00098, 0.00096 ...; 10.01k, 10.02k) and more where neighbours would
  // still read the same (688.25MiB, 688.50MiB), so that a narrow range (a learning rate that barely moves) is not
  // one label repeated. Below 1e-4, powers of ten (9.8e-6). `even`: the ticks are evenly spaced; a log axis's are
  // not: each is written as a value is (0.32, 3.16, 10), with significant digits added until neighbours differ.
  function tickLabels(ticks, bytes, even) {
    if (!even) {
      const plain = ticks.map(t => (bytes ? formatBytes(t) : format(t)));
      if (distinct(plain)) { return plain; }
    }
    const top = Math.max(...ticks.map(Math.abs));
    let scale = 1, suffix = "";
    if (bytes) {
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let i = 0;
      while (top / scale >= 1024 && i < units.length - 1) { scale *= 1024; i++; }
      suffix = units[i];
    } else if (top >= 1e9) { scale = 1e9; suffix = "G"; }
    else if (top >= 1e6) { scale = 1e6; suffix = "M"; }
    else if (top >= 1e4) { scale = 1e3; suffix = "k"; }
    const small = !bytes && top > 0 && top < 1e-4;
    const spacing = even && ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) / scale : 0;
    let needed = 0;
    if (spacing > 0 && small) { needed = Math.floor(Math.log10(top)) - Math.floor(Math.log10(spacing) + 1e-9); }
    else if (spacing > 0 && !bytes) { needed = Math.ceil(-Math.log10(spacing) - 1e-9); }
    let texts = [];
    for (let digits = Math.min(Math.max(0, needed), 15); digits <= 15; digits++) {
      texts = ticks.map(t => t === 0 ? "0" : small ? t.toExponential(digits)
        : even ? (t / scale).toFixed(digits) + suffix : (t / scale).toPrecision(digits + 1) + suffix);
      if (distinct(texts)) { break; }
    }
    return texts;
  }

  function drawChart(canvas, spec) {
    const ratio = global.devicePixelRatio || 1;
    const width = canvas.clientWidth || 320, height = canvas.clientHeight || 180;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const tr = v => (spec.logY ? Math.log10(v) : v);
    let xMin = Infinity, xMax = -Infinity, yMin = Infinity, yMax = -Infinity, points = 0;
    for (const s of spec.series) {
      for (let i = 0; i < s.xs.length; i++) {
        const y = s.ys[i];
        if (!finite(y) || (spec.logY && y <= 0)) { continue; }
        xMin = Math.min(xMin, s.xs[i]); xMax = Math.max(xMax, s.xs[i]);
        yMin = Math.min(yMin, tr(y)); yMax = Math.max(yMax, tr(y));
        points++;
      }
    }
    // A shared x range (every chart of a report spans the whole run, also where a series has no finite value).
    if (spec.xRange) { xMin = Math.min(xMin, spec.xRange[0]); xMax = Math.max(xMax, spec.xRange[1]); }
    canvas.dataset.xMin = String(xMin);
    canvas.dataset.xMax = String(xMax);
    const clip = finite(spec.clipAbove) && !spec.logY && spec.clipAbove < yMax ? spec.clipAbove : undefined;
    if (clip !== undefined) { yMax = clip; }
    if (spec.zero && !spec.logY) { yMin = Math.min(yMin, 0); }
    canvas.dataset.clipped = "0";
    const bound = spec.bound ? (spec.bound.max !== undefined ? spec.bound.max : spec.bound.min) : undefined;
    if (bound !== undefined && points) { yMin = Math.min(yMin, tr(bound)); yMax = Math.max(yMax, tr(bound)); }
    canvas.dataset.points = String(points);
    canvas.dataset.markers = "0";
    canvas.dataset.bands = "0";
    canvas.dataset.yTicks = "";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#888";
    if (!points) {
      ctx.fillText("no data yet", width / 2 - 30, height / 2);
      return 0;
    }
    if (yMax === yMin) { yMax += Math.abs(yMax) * 0.05 || 1; yMin -= Math.abs(yMin) * 0.05 || 1; }
    if (xMax === xMin) { xMax = xMin + 1; }
    const yTicks = niceTicks(yMin, yMax, 4);
    const yLabels = tickLabels(yTicks.map(t => (spec.logY ? Math.pow(10, t) : t)), spec.unit === "bytes", !spec.logY);
    canvas.dataset.yTicks = yLabels.join("|");
    // As wide a left margin as the longest label needs (a learning rate of 0.0009999975 needs more than 56 px).
    const left = Math.max(PAD.left, Math.ceil(Math.max(...yLabels.map(t => ctx.measureText(t).width))) + 10);
    const plotW = width - left - PAD.right, plotH = height - PAD.top - PAD.bottom;
    const X = x => left + (x - xMin) / (xMax - xMin) * plotW;
    const Y = y => PAD.top + (1 - (tr(y) - yMin) / (yMax - yMin)) * plotH;
    // grid and axes
    ctx.strokeStyle = "rgba(128,128,128,0.25)";
    ctx.lineWidth = 1;
    yTicks.forEach((t, i) => {
      const py = PAD.top + (1 - (t - yMin) / (yMax - yMin)) * plotH;
      ctx.beginPath(); ctx.moveTo(left, py); ctx.lineTo(width - PAD.right, py); ctx.stroke();
      ctx.fillText(yLabels[i], 4, py + 4);
    });
    for (const t of niceTicks(xMin, xMax, 5)) {
      const px = X(t);
      ctx.fillText(format(t), px - 10, height - 6);
    }
    // bands: shaded stretches of steps (non-finite losses), their label on top
    let bands = 0;
    for (const b of spec.bands || []) {
      if (b.to < xMin || b.from > xMax) { continue; }
      const x0 = X(Math.max(b.from, xMin)), x1 = X(Math.min(b.to, xMax));
      ctx.fillStyle = b.color;
      ctx.fillRect(Math.min(x0, x1 - 3), PAD.top, Math.max(x1 - x0, 3) + 3, plotH);
      if (b.label) {  // on a light patch, so that it reads over the band's own ticks
        const w = ctx.measureText(b.label).width;
        ctx.fillStyle = "rgba(255,255,255,0.9)";
        ctx.fillRect(x0 + 1, PAD.top + 1, w + 4, 13);
        ctx.fillStyle = "#c92a2a";
        ctx.fillText(b.label, x0 + 3, PAD.top + 11);
      }
      bands++;
    }
    canvas.dataset.bands = String(bands);
    // the threshold, dashed
    if (bound !== undefined) {
      ctx.save();
      ctx.setLineDash([5, 4]);
      ctx.strokeStyle = "#e8590c";
      ctx.beginPath(); ctx.moveTo(left, Y(bound)); ctx.lineTo(width - PAD.right, Y(bound)); ctx.stroke();
      ctx.restore();
    }
    // markers: vertical ticks (non-finite steps, breaches); counted where they fall inside the x range, drawn
    let markers = 0;
    for (const m of spec.markers || []) {
      if (m.x < xMin || m.x > xMax) { continue; }
      ctx.strokeStyle = m.color;
      ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(X(m.x), PAD.top); ctx.lineTo(X(m.x), PAD.top + plotH); ctx.stroke();
      markers++;
    }
    canvas.dataset.markers = String(markers);
    // lines; a gap where a value is missing or not finite; points past the bound drawn red
    for (const s of spec.series) {
      ctx.strokeStyle = s.color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (let i = 0; i < s.xs.length; i++) {
        const y = s.ys[i];
        if (!finite(y) || (spec.logY && y <= 0)) { pen = false; continue; }
        const shown = clip !== undefined ? Math.min(y, clip) : y;
        if (pen) { ctx.lineTo(X(s.xs[i]), Y(shown)); } else { ctx.moveTo(X(s.xs[i]), Y(shown)); pen = true; }
      }
      ctx.stroke();
      if (clip !== undefined) {  // points above the axis: a triangle on the top edge, so they are not hidden
        ctx.fillStyle = s.color;
        let clipped = 0;
        for (let i = 0; i < s.xs.length; i++) {
          if (!(finite(s.ys[i]) && s.ys[i] > clip)) { continue; }
          const px = X(s.xs[i]);
          ctx.beginPath(); ctx.moveTo(px, PAD.top); ctx.lineTo(px - 4, PAD.top + 7); ctx.lineTo(px + 4, PAD.top + 7);
          ctx.fill();
          clipped++;
        }
        canvas.dataset.clipped = String(Number(canvas.dataset.clipped) + clipped);
      }
      if (bound !== undefined && !s.noBound) {
        ctx.fillStyle = "#e03131";
        for (let i = 0; i < s.xs.length; i++) {
          const y = s.ys[i];
          const out = finite(y) && (spec.bound.max !== undefined ? y > bound : y < bound);
          if (out) { ctx.fillRect(X(s.xs[i]) - 2, Y(y) - 2, 4, 4); }
        }
      }
    }
    return points;
  }

  global.msExporterChart = {drawChart: drawChart, format: format, formatBytes: formatBytes, tickLabels: tickLabels};
})(typeof window !== "undefined" ? window : this);
