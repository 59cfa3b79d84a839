# Sheepfold: describe a matplotlib figure as data (E2B's "chart" result), so
# that a client gets the plotted values along with the PNG. Loaded by the
# Python driver the first time it renders a figure.
#
# The output follows what E2B's sandbox gives for the same figure (its chart
# extractor, e2b_charts): the same detection of the chart type from the
# artists of the axes, the same fields, null for an unset title or label,
# the same rounding (8 significant digits) of pie angles and box plots, and
# the same datetime and categorical scale rules. Only the facts are shared:
# this is our own code, with no pydantic.
import datetime
import math
import re
from decimal import Decimal, localcontext

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _round(v):
    """v to 8 significant digits, as a float (E2B's rounding)."""
    d = Decimal(str(v))
    with localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return float(+d)


def _float(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return None if math.isnan(f) or math.isinf(f) else f


def _point(v):
    """One coordinate as E2B renders it: dates as ISO 8601, numbers as
    floats, anything else (a category) as it is."""
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    np = _numpy()
    if np is not None and isinstance(v, np.datetime64):
        return str(v.astype("datetime64[s]"))
    if isinstance(v, str):
        return v
    return _float(v)


def _numpy():
    import sys
    return sys.modules.get("numpy")


def _unset(s):
    return None if s == "" else s


def _unit(label):
    if not label:
        return None
    m = _UNIT.search(label)
    return (m.group(1) or m.group(2)) if m else None


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if get is not None else getattr(axis, "converter", None)


def _is_date_converter(conv):
    import matplotlib.dates as mdates
    kinds = tuple(k for k in (getattr(mdates, "_SwitchableDateConverter", None), mdates.DateConverter) if k)
    return isinstance(conv, kinds)


def _ticks(conv, ticks):
    if _is_date_converter(conv):
        import matplotlib.dates as mdates
        return [mdates.num2date(t).isoformat() for t in ticks]
    return [_point(t) for t in ticks]


def _scale(conv, scale, ticks, labels):
    """E2B's rule: a date axis is "datetime"; a non-linear one keeps its
    scale; a linear one whose ticks are 0..n-1 labelled with something
    other than those numbers is "categorical"."""
    if _is_date_converter(conv):
        return "datetime"
    if scale != "linear":
        return scale
    for i, (tick, label) in enumerate(zip(ticks, labels)):
        if not (isinstance(tick, (int, float)) and tick == i and str(i) != label):
            return "linear"
    return "categorical"


def _base(ax, kind):
    return {"type": kind, "title": _unset(ax.get_title()), "elements": []}


def _base2d(ax, kind):
    c = _base(ax, kind)
    c["x_label"], c["y_label"] = _unset(ax.get_xlabel()), _unset(ax.get_ylabel())
    c["x_unit"], c["y_unit"] = _unit(c["x_label"]), _unit(c["y_label"])
    return c


def _swap(c):
    c["x_label"], c["y_label"] = c["y_label"], c["x_label"]
    c["x_unit"], c["y_unit"] = c["y_unit"], c["x_unit"]


def _point_chart(ax, kind):
    c = _base2d(ax, kind)
    for which, axis, ticks, labels, scale in (
            ("x", ax.xaxis, ax.get_xticks(), ax.get_xticklabels(), ax.get_xscale()),
            ("y", ax.yaxis, ax.get_yticks(), ax.get_yticklabels(), ax.get_yscale())):
        conv = _converter(axis)
        c[which + "_tick_labels"] = [t.get_text() for t in labels]
        c[which + "_ticks"] = _ticks(conv, ticks)
        c[which + "_scale"] = _scale(conv, scale, c[which + "_ticks"], c[which + "_tick_labels"])
    return c


def _is_grid_line(line):
    x, y = line.get_xdata(), line.get_ydata()
    return len(x) == 2 and len(y) == 2 and (x[0] == x[1] or y[0] == y[1])


def _line(ax):
    c = _point_chart(ax, "line")
    for line in ax.get_lines():
        if _is_grid_line(line):
            continue
        label = line.get_label()
        if label.startswith("_child"):
            label = "Line " + label[len("_child"):]
        c["elements"].append({"label": label,
                              "points": [[_point(x), _point(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]})
    return c


def _scatter(ax):
    c = _point_chart(ax, "scatter")
    for col in ax.collections:
        c["elements"].append({"label": col.get_label(),
                              "points": [[_point(x), _point(y)] for x, y in col.get_offsets()]})
    return c


def _bar(ax):
    c = _base2d(ax, "bar")
    for container in ax.containers:
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group " + group[len("_container"):]
        heights = [r.get_height() for r in container]
        if all(h == heights[0] for h in heights):  # bars of one height: read as horizontal
            _swap(c)
            labels = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in container]
        else:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            values = heights
        for label, value in zip(labels, values):
            c["elements"].append({"label": label, "group": group, "value": _float(value)})
    return c


def _pie(ax):
    c = _base(ax, "pie")
    for w in ax.patches:
        angle = Decimal(float(w.theta2)) - Decimal(float(w.theta1))
        c["elements"].append({"label": w.get_label(), "angle": abs(_round(angle)), "radius": _float(w.r)})
    return c


def _box_and_whisker(ax):
    c = _base2d(ax, "box_and_whisker")
    labels = [t.get_text() for t in ax.get_xticklabels()]
    boxes = []
    for label, patch in zip(labels, ax.patches):
        v = patch.get_path().vertices
        xs, ys = [_round(x) for x in v[:, 0]], [_round(y) for y in v[:, 1]]
        x, y = min(xs), min(ys)
        boxes.append({"x": x, "y": y, "w": max(xs) - x, "h": max(ys) - y, "label": label, "outliers": []})
    vertical = bool(boxes) and all(b["h"] == boxes[0]["h"] for b in boxes)
    if vertical:
        _swap(c)
        for b in boxes:
            b["x"], b["y"], b["w"], b["h"] = b["y"], b["x"], b["h"], b["w"]

    def box_at(lo, hi):
        for b in boxes:
            if b["x"] <= lo <= hi <= b["x"] + b["w"]:
                return b
        return None

    for line in ax.lines:
        xd, yd = [_round(x) for x in line.get_xdata()], [_round(y) for y in line.get_ydata()]
        if vertical:
            xd, yd = yd, xd
        if len(xd) == 1:
            b = box_at(xd[0], xd[0])
            if b is None:
                continue
            b["outliers"].append(yd[0])
        if len(yd) != 2:
            continue
        b = box_at(xd[0], xd[1])
        if b is None:
            continue
        if yd[0] == yd[1] and b["y"] <= yd[0] <= b["y"] + b["h"]:
            b["median"] = yd[0]
        elif max(yd) == b["y"]:
            b["min"] = min(yd)
        elif min(yd) == b["y"] + b["h"]:
            b["max"] = max(yd)
    c["elements"] = [{"label": b["label"], "min": b.get("min"), "first_quartile": b["y"], "median": b.get("median"),
                      "third_quartile": b["y"] + b["h"], "max": b.get("max"), "outliers": b["outliers"]}
                     for b in boxes]
    return c


def _kind(ax):
    """The chart type of one axes, decided as E2B decides it: from the
    kinds of its artists (text aside)."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)
    if children is None:
        children = list(ax.lines) + list(ax.collections) + list(ax.patches)
    objs = [o for o in children if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_grid_line(o))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(o, cls) for o in objs):
            return kind
    return "unknown"


_BUILD = {"line": _line, "scatter": _scatter, "bar": _bar, "pie": _pie, "box_and_whisker": _box_and_whisker}


def _axes_chart(ax):
    kind = _kind(ax)
    build = _BUILD.get(kind)
    return build(ax) if build is not None else _base(ax, kind)


def chart(fig):
    """The figure as E2B's chart object, or None when it has no axes or
    nothing is plotted on them."""
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return _axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": title, "elements": [_axes_chart(ax) for ax in axes]}
