"""The HTML page of a report: one jinja2 template, self-contained (inline style and script, plots as ``data:`` URIs).

Figures: each is drawn at its own pixel size up to the page's width (never enlarged, never squeezed into a column it
does not fit): a figure wider than `WIDE_PIXELS` spans the page, narrower ones share a row; every figure links to its
PNG file written beside the page (``<plot id>.png``), to be opened at full size.

Tables come from `render` as a header of (name, is text) cells and rows of (value, is text, is red) cells: text aligns
left, numbers right; a red cell is a value of a cell scored under ``--allow-in-distribution``. The
Content-Security-Policy forbids the page any request (``default-src 'none'``): only inline style, inline script
and ``data:`` images load. The script sorts a table by the column whose header is clicked (numbers as numbers, ``–``
last).
"""

WIDE_PIXELS = 800
"""A figure wider than this (in PNG pixels) takes a row of its own: two of them side by side would be drawn at less than
two thirds of their size in the page's 1200 pixels."""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>elastic-bench report</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;
     color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.88em}
th,td{border:1px solid #d6d6d6;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;cursor:pointer;user-select:none}th:hover{background:#e6e6e6}
th.asc::after{content:" ▲"}th.desc::after{content:" ▼"}
.text{text-align:left}tbody tr:nth-child(even){background:#fafafa}td.allowed{color:#c00000;font-weight:600}
.protocol{color:#555;font-weight:normal;font-size:.85em}
.scroll{overflow-x:auto}.note{color:#555;font-size:.88em;max-width:70em}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:1em}figure{margin:0}
figure.wide{grid-column:1/-1}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.88em}
nav ul{font-size:.92em;margin:.2em 0}code{background:#f4f4f4;padding:0 3px}
details{margin:.3em 0}summary{cursor:pointer}
</style></head><body>
{% macro table(t) %}<table class="sortable"><thead><tr>
{% for name, text in t.header %}<th{% if text %} class="text"{% endif %}>{{ name }}</th>{% endfor %}</tr></thead><tbody>
{% for row in t.rows %}<tr>{% for value, text, red in row %}<td
{%- if text or red %} class="{{ "text" if text }}{{ " " if text and red }}{{ "allowed" if red }}"{% endif %}>
{{- value }}</td>
{% endfor %}</tr>{% endfor %}</tbody></table>{% endmacro %}
<h1>elastic-bench report</h1>
<p>Results: <code>{{ source }}</code> · generated {{ stamp }}</p>
<nav><h2 id="contents">Contents</h2><ul>
<li><a href="#provenance">Provenance</a></li>
{% for s in sections %}<li><a href="#{{ s.id }}">{{ s.title }}</a><ul>
{% for g in s.groups %}<li><a href="#{{ g.id }}">{{ g.heading }}</a></li>{% endfor %}
{% if s.cells %}<li><a href="#{{ s.id }}-cells">Excluded and failed cells</a></li>{% endif %}
</ul></li>{% endfor %}
</ul></nav>
<h2 id="provenance">Provenance</h2>
{{ table(provenance) }}
{% for s in sections %}
<h2 id="{{ s.id }}">{{ s.title }}</h2>
<p>{{ s.comparable }}</p>
<p class="note">{{ s.protocol }}</p>
{% for g in s.groups %}
<h3 id="{{ g.id }}">{{ g.heading }}</h3>
{% for t in g.tables %}<h4 id="{{ s.id }}-{{ t.id }}">{{ t.title }}{% if t.protocol %}
<span class="protocol">· protocol: {{ t.protocol }}</span>{% endif %}</h4><div class="scroll">{{ table(t) }}</div>
{% if t.note %}<p class="note">{{ t.note }}</p>{% endif %}{% endfor %}
{% if g.plots %}<div class="plots">{% for p in g.plots %}<figure id="{{ p.id }}"{% if p.wide %} class="wide"{% endif %}>
<a href="{{ p.id }}.png" title="the PNG at full size"><img src="data:image/png;base64,{{ p.data }}" alt="{{ p.title }}"
 width="{{ p.width }}" height="{{ p.height }}"></a>
<figcaption>{{ p.caption }} <a href="{{ p.id }}.png">Full-size PNG</a> ({{ p.width }} × {{ p.height }}).
</figcaption></figure>{% endfor %}</div>{% endif %}
{% for n in g.notes %}<p class="note">{{ n }}</p>{% endfor %}
{% endfor %}
{% if s.cells %}<h3 id="{{ s.id }}-cells">Excluded and failed cells</h3>
{% for title, folds in s.cells %}<h4>{{ title }}</h4>
{% for message, where in folds %}<details><summary>{{ message }}
({{ where | length }} cell{{ "s" if where | length > 1 }})</summary>
<ul>{% for w in where %}<li>{{ w }}</li>{% endfor %}</ul></details>{% endfor %}{% endfor %}{% endif %}
{% endfor %}
<script>
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var down = th.classList.contains("asc"), body = table.tBodies[0];
      table.querySelectorAll("thead th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(down ? "desc" : "asc");
      var key = function (row) { var t = row.cells[col].textContent, v = parseFloat(t); return isNaN(v) ? t : v; };
      Array.from(body.rows).sort(function (a, b) {
        var x = key(a), y = key(b), n = typeof x === "number", m = typeof y === "number";
        if (n !== m) return n ? -1 : 1;  // numbers before text (–) either way
        var c = n ? x - y : x.localeCompare(y);
        return down ? -c : c;
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
});
</script>
</body></html>
"""
