"""comet-dse explore: what the page computes (no browser needed) and the page itself in headless Chromium."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from comet_dse.answers.overrides import apply_overrides
from comet_dse.base.errors import InputError
from comet_dse.design_space.search import search
from comet_dse.design_space.space import SearchSpace, with_cluster_defaults
from comet_dse.presets.catalog import load_cluster, load_model
from comet_dse.web import figures
from comet_dse.web.view import Controls, compute, controls_for, overrides_for
from cli_run import one_line_error

GiB = 2.0**30


@pytest.fixture(scope="module")
def default_view():
    return compute(Controls())


def test_the_view_is_the_search(default_view):
    """The page's best strategy is `search`'s on the same inputs, with a search's defaults on that cluster
    (comet-dse search: TP inside the scale-up domain); every split and resource is drawn."""
    tpu = load_cluster("tpu-v4")
    base = search(load_model("megatron-1t"), tpu, 4096, 2048, with_cluster_defaults(SearchSpace(), tpu, 4096))
    assert default_view.evaluated == base.evaluated and default_view.feasible == base.feasible
    assert default_view.top[0]["step_time_s"] == pytest.approx(float(base.columns["step_time_s"][base.ranked[0]]))
    assert default_view.chosen["rank"] == 1 and sum(default_view.chosen["breakdown_s"].values()) == pytest.approx(
        default_view.top[0]["step_time_s"])
    assert {s["mp"] for s in default_view.splits} == {int(v) for v in set(base.columns["tp"] * base.columns["pp"])}
    assert [d["resource"] for d in default_view.doubling][:2] == ["peak_flops", "hbm_capacity"]
    for make in (figures.bathtub, figures.memory, figures.breakdown, figures.doubling):
        figure = make(default_view)
        assert figure["data"] and figure["layout"]["title"]["text"]


def test_a_30k_strategy_view_shrinks_with_hbm_capacity():
    """GPT-3 175B on 1024 H100s: about 40 K strategies, the search, the splits and eight doublings. How fast
    the page answers this is measured by benchmarks/bench_web.py, not asserted here (docs/reliability.md)."""
    controls = Controls(model="gpt3-175b", cluster="dgx-h100", devices=1024, global_batch=1536,
                        tp_across_nodes=True)       # every TP degree: the 40 K strategies
    feasible = []
    for capacity in (80, 64, 48):
        view = compute(Controls(**{**controls.__dict__, "resources": {"hbm_capacity": capacity}}))
        assert view.evaluated >= 30_000 and view.capacity_bytes == capacity * GiB
        feasible.append(view.feasible)
    assert feasible[0] > feasible[1] > feasible[2] > 0, feasible


def test_hbm_capacity_moves_the_best_strategy_and_the_wall(default_view):
    small = compute(Controls(resources={"hbm_capacity": 16}))
    assert small.top[0]["strategy"] != default_view.top[0]["strategy"]
    assert small.capacity_bytes == 16 * GiB and small.feasible < default_view.feasible
    walled = [s for s in small.splits if not s["fits"] and s["why"].startswith("does not fit")]
    assert walled and all("HBM holds 16.0 GiB" in s["why"] for s in walled)
    cluster = apply_overrides(load_cluster("tpu-v4"), [("hbm_capacity", "16GiB")])
    base = search(load_model("megatron-1t"), cluster, 4096, 2048)
    assert small.top[0]["step_time_s"] == pytest.approx(float(base.columns["step_time_s"][base.ranked[0]]))


def test_controls_become_overrides_only_where_they_differ():
    tpu = load_cluster("tpu-v4")
    values = {r.key: v for r, v in controls_for("tpu-v4")}
    assert overrides_for(tpu, values) == ([], None)
    values.update({"hbm_capacity": 48, "network.y.topology": "ring", "network.x.link_bandwidth": 90,
                   "peak_flops": 550, "expansion_capacity": 256, "expansion_bandwidth": 32})
    settings, expansion = overrides_for(tpu, values)
    assert dict(settings) == {"hbm_capacity": "48.0GiB", "network.y.topology": "ring",
                              "network.x.link_bandwidth": "90.0GB/s", "peak_flops": "x2.0"}
    assert expansion == "256.0GiB@32.0GB/s"
    view = compute(Controls(resources=values))
    assert view.expansion_bytes == 256 * GiB


@pytest.mark.parametrize("resources, field", [
    ({"hbm_capacity": 0}, "hbm_capacity"),            # refused in the control's unit (out_of_range)
    ({"hbm_capacity": 9e9}, "hbm_capacity"),
    ({"hbm_capacity": "lots"}, "hbm_capacity"),
    ({"network.x.topology": "star"}, "cluster network.x.topology"),
])
def test_bad_control_values_are_input_errors(resources, field):
    with pytest.raises(InputError) as info:
        compute(Controls(resources=resources))
    assert info.value.field == field


def test_devices_the_network_cannot_hold_are_input_errors():
    with pytest.raises(InputError, match="devices"):
        compute(Controls(devices=4097))


def test_values_typed_for_another_cluster_are_dropped():
    pytest.importorskip("dash")
    from comet_dse.web.app import controls_from

    ids = [{"type": "resource", "key": "hbm_capacity", "cluster": "tpu-v4"},
           {"type": "resource", "key": "hbm_bandwidth", "cluster": "dgx-h100"}]
    controls = controls_from("megatron-1t", "", "dgx-h100", 1024, 1024, 1, [16, 4], ids)
    assert controls.resources == {"hbm_bandwidth": 4} and controls.cluster == "dgx-h100"
    with pytest.raises(InputError, match="devices"):
        controls_from("megatron-1t", "", "dgx-h100", None, 1024, 1, [], [])
    assert controls_from("megatron-1t", " cfg.json ", "tpu-v4", 8, 8, None, [], []).model == "cfg.json"


def test_explore_without_dash_says_how_to_install(monkeypatch, capsys):
    from comet_dse.cli import main

    monkeypatch.setitem(sys.modules, "dash", None)
    assert main(["explore", "--port", "8050"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "comet-dse: error: explore: needs Dash: pip install 'comet-dse[explore]'"


# ---- the page in a real browser -------------------------------------------------------------------------

def _browser_or_skip():
    """(playwright's sync_playwright, chromium path), or a skip; a failure where CI requires the browser."""
    required = os.environ.get("COMET_DSE_REQUIRE_BROWSER")
    missing = []
    try:
        import dash  # noqa: F401
    except ImportError:
        missing.append("dash (pip install '.[explore]')")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("playwright (pip install '.[test]')")
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                   None)
    if browser is None:
        missing.append("Debian's chromium")
    if missing:
        if required:
            pytest.fail(f"the explorer's browser test is required here but needs {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)} (CI installs them and runs this test)")
    return sync_playwright, browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """`comet-dse explore` on a free port of this machine; its URL once it answers."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "comet_dse.cli", "explore", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line, line
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _svg(page, graph: str) -> str:
    """The drawn figure: every SVG layer Plotly wrote into the graph (plot, legend)."""
    return page.inner_html(f"#{graph} .js-plotly-plot")


def _change(page, selector: str, value: str, before: dict) -> None:
    """Type ``value`` into the control, press Enter, wait until the best strategy, the bathtub and the
    memory figure all differ from ``before`` (at most 120 s: a hang, not a speed limit; the page's speed is
    benchmarks/bench_web.py's)."""
    box = page.locator(selector)
    box.fill(value)
    box.press("Enter")
    page.wait_for_function(
        """([best, bath, mem]) => {
             const t = document.querySelector('#best-text');
             const b = document.querySelector('#bathtub .js-plotly-plot');
             const m = document.querySelector('#memory .js-plotly-plot');
             return t && b && m && t.innerText !== best && b.innerHTML !== bath && m.innerHTML !== mem; }""",
        arg=[before["best"], before["bathtub"], before["memory"]], timeout=120_000)


def _state(page) -> dict:
    return {"best": page.inner_text("#best-text"), "bathtub": _svg(page, "bathtub"), "memory": _svg(page, "memory"),
            "status": page.inner_text("#status")}


def test_explorer_in_headless_chromium(server, tmp_path):
    sync_playwright, browser = _browser_or_skip()
    errors, outside = [], []
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=browser, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 1500})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: None if r.url.startswith(server) else outside.append(r.url))
            page.goto(server)
            page.wait_for_selector("#best-text", timeout=60_000)
            page.wait_for_selector("#bathtub .main-svg", timeout=60_000)
            page.wait_for_selector("#memory .main-svg", timeout=60_000)
            first = _state(page)
            assert "4,096 x tpu-v4" in first["status"] and re.search(r"[\d,]+ strategies evaluated", first["status"])
            page.wait_for_selector("#time-to-train", timeout=60_000)        # the token budget control's 1T
            assert re.fullmatch(r"[\d,.]+ days", page.inner_text("#time-to-train")), page.inner_text("#training")
            assert re.fullmatch(r"\$[\d,.]+[kMB]?", page.inner_text("#training-cost")), page.inner_text("#training")

            _change(page, 'input[id*="hbm_capacity"]', "16", first)
            second = _state(page)
            assert "hbm_capacity=16.0GiB" in second["status"] and "does not fit" in second["bathtub"]

            _change(page, "#devices", "2048", second)
            third = _state(page)
            assert "2,048 x tpu-v4" in third["status"]
            page.screenshot(path=str(tmp_path / "explore.png"), full_page=True)
        finally:
            chromium.close()
    assert (tmp_path / "explore.png").stat().st_size > 50_000       # a drawn page, not a blank one
    assert not errors, errors
    assert not outside, outside                                      # offline: nothing but the local server


@pytest.mark.parametrize("argv, needle", [
    (["--port", "70000"], "port: must be in [1, 65535]"),
    (["--port", "0"], "--port: expected a positive integer"),
    (["--host", "203.0.113.7"], "port: cannot serve on 203.0.113.7:"),
])
def test_bad_explore_options_are_one_line_and_exit_2(argv, needle):
    pytest.importorskip("dash")
    proc = subprocess.run([sys.executable, "-m", "comet_dse.cli", "explore", *argv], capture_output=True, text=True,
                          timeout=60)
    one_line_error((proc.returncode, proc.stdout, proc.stderr), needle)


def test_port_in_use_is_one_line_and_exit_2():
    pytest.importorskip("dash")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "comet_dse.cli", "explore", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    one_line_error((proc.returncode, proc.stdout, proc.stderr), f"port: cannot serve on 127.0.0.1:{port}")


def test_a_control_out_of_range_is_refused_in_its_own_unit():
    """One unit system: the explorer's HBM control is in GiB, and so is its refusal (not raw bytes)."""
    from comet_dse.base.errors import InputError
    from comet_dse.web.view import out_of_range
    with pytest.raises(InputError) as err:
        out_of_range({"hbm_capacity": 5000})
    assert err.value.field == "hbm_capacity" and "5,000 GiB" in err.value.message and "4,096 GiB" in err.value.message
    assert "e+12" not in err.value.message
    out_of_range({"hbm_capacity": 96, "expansion_capacity": 0})        # within range: nothing to say


def test_a_partly_used_scale_up_domain_is_said_out_loud():
    from comet_dse.presets.catalog import load_cluster
    from comet_dse.web.view import partial_domains
    assert partial_domains(load_cluster("gb200-nvl72"), 128) == (
        "2 nvlink domains used in part: 64 of the 72 devices of each (whole nodes; the rest idle)")
    assert partial_domains(load_cluster("gb200-nvl72"), 144) == ""
    assert partial_domains(load_cluster("dgx-h100"), 64) == ""


def test_the_expert_overlap_and_fp8_dispatch_controls_reach_the_search():
    from comet_dse.web.view import STRATEGY_CONTROLS, Controls, compute
    assert {"ep_overlap", "ep_fp8_dispatch"} <= set(STRATEGY_CONTROLS)
    view = compute(Controls(model="mixtral-8x7b", cluster="dgx-h100", devices=64, global_batch=64, resources={},
                            rank=1, tokens=None, strategy={"ep_overlap": "on", "dtype": "fp8", "ep_fp8_dispatch": "on"},
                            tp_across_nodes=False))
    assert view.top and all("epo" in r["strategy"] and "ep-fp8" in r["strategy"] for r in view.top)


def test_the_activation_offload_control_reaches_the_search():
    """The share chosen on the page is searched: every listed design offloads it."""
    from comet_dse.web.view import STRATEGY_CONTROLS, Controls, compute
    assert "activation_offload" in STRATEGY_CONTROLS
    view = compute(Controls(model="llama3-70b", cluster="gb200-nvl72", devices=64, global_batch=64, resources={},
                            rank=1, tokens=None, strategy={"activation_offload": "0.5"}, tp_across_nodes=False))
    assert view.top and all("aoff0.5" in r["strategy"] for r in view.top)


def test_the_fp8_fused_cast_control_reaches_the_search():
    """XLA's fp8 (the cast inside the matmuls) chosen on the page is searched: every listed design runs it."""
    from comet_dse.web.view import STRATEGY_CONTROLS, Controls, compute
    assert "fp8_fused_cast" in STRATEGY_CONTROLS
    view = compute(Controls(model="llama3-70b", cluster="tpu-v7", devices=64, global_batch=64, resources={},
                            rank=1, tokens=None, strategy={"dtype": "fp8", "fp8_fused_cast": "on"},
                            tp_across_nodes=False))
    assert view.top and all("fp8-fused" in r["strategy"] for r in view.top)
