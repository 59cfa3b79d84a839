# Sheepfold: describe a matplotlib figure as data (E2B's "chart" result), so
# that a client gets the plotted values along with the PNG. Loaded by the
# Python driver the first time it renders a figure.
import math
import re

_UNIT = re.compile(r"\s*[\(\[]([^\)\]]+)[\)\]]\s*$")


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f) or math.isinf(f):
        return None
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _label(artist):
    s = artist.get_label() or ""
    return "" if s.startswith("_") else s


def _unit(label):
    m = _UNIT.search(label or "")
    return m.group(1) if m else None


def _is_dates(axis):
    try:
        import matplotlib.dates as mdates
        return isinstance(axis.get_major_locator(), mdates.DateLocator) or \
            isinstance(axis.get_converter() if hasattr(axis, "get_converter") else axis.converter, mdates.DateConverter)
    except Exception:
        return False


def _is_categorical(axis):
    try:
        import matplotlib.category as mcat
        return isinstance(axis.units, mcat.UnitData)
    except Exception:
        return False


def _scale(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    if _is_dates(axis):
        return "datetime"
    if _is_categorical(axis):
        return "categorical"
    return ax.get_xscale() if which == "x" else ax.get_yscale()


def _value(axis, v, dates):
    if dates:
        try:
            import matplotlib.dates as mdates
            return mdates.num2date(v).isoformat()
        except Exception:
            pass
    return _num(v)


def _ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    dates = _is_dates(axis)
    ticks = ax.get_xticks() if which == "x" else ax.get_yticks()
    labels = ax.get_xticklabels() if which == "x" else ax.get_yticklabels()
    return [_value(axis, t, dates) for t in ticks], [t.get_text() for t in labels]


def _base2d(ax, kind):
    xl, yl = ax.get_xlabel(), ax.get_ylabel()
    return {"type": kind, "title": ax.get_title(), "x_label": xl, "y_label": yl,
            "x_unit": _unit(xl), "y_unit": _unit(yl), "elements": []}


def _points(ax, kind, series):
    c = _base2d(ax, kind)
    xd, yd = _is_dates(ax.xaxis), _is_dates(ax.yaxis)
    for label, xy in series:
        c["elements"].append({"label": label,
                              "points": [[_value(ax.xaxis, x, xd), _value(ax.yaxis, y, yd)] for x, y in xy]})
    c["x_ticks"], c["x_tick_labels"] = _ticks(ax, "x")
    c["y_ticks"], c["y_tick_labels"] = _ticks(ax, "y")
    c["x_scale"], c["y_scale"] = _scale(ax, "x"), _scale(ax, "y")
    return c


def _axes_chart(ax):
    from matplotlib.container import BarContainer
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return {"type": "pie", "title": ax.get_title(),
                "elements": [{"label": w.get_label(), "angle": _num(abs(w.theta2 - w.theta1)), "radius": _num(w.r)}
                             for w in wedges]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        c = _base2d(ax, "bar")
        vertical = all(getattr(b, "orientation", "vertical") != "horizontal" for b in bars)
        axis = ax.xaxis if vertical else ax.yaxis
        positions = list(ax.get_xticks() if vertical else ax.get_yticks())
        names = [t.get_text() for t in (ax.get_xticklabels() if vertical else ax.get_yticklabels())]
        for b in bars:
            for rect in b.patches:
                at = rect.get_x() + rect.get_width() / 2 if vertical else rect.get_y() + rect.get_height() / 2
                label = None
                for pos, name in zip(positions, names):
                    if abs(pos - at) < 1e-6 and name:
                        label = name
                if label is None:
                    label = str(_value(axis, at, _is_dates(axis)))
                c["elements"].append({"label": label, "group": _label(b),
                                      "value": _num(rect.get_height() if vertical else rect.get_width())})
        return c
    scatters = [col for col in ax.collections if isinstance(col, PathCollection) and len(col.get_offsets())]
    lines = [ln for ln in ax.get_lines() if len(ln.get_xydata())]
    if scatters and not lines:
        return _points(ax, "scatter", [(_label(s), s.get_offsets()) for s in scatters])
    if lines:
        return _points(ax, "line", [(_label(ln), ln.get_xydata()) for ln in lines])
    return {"type": "unknown", "title": ax.get_title(), "elements": []}


def chart(fig):
    """The figure as E2B's chart object, or None when it has no axes."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    if not axes:
        return None
    if len(axes) == 1:
        return _axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    return {"type": "superchart", "title": title, "elements": [_axes_chart(ax) for ax in axes]}
