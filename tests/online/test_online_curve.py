"""Transport security: loopback by default, and ZeroMQ CURVE encryption when configured
(a runner without the server's public key cannot even greet it)."""

import threading

import numpy as np
import pytest
import zmq

from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig
from enkflow.experiment.cycling import ObservationSpace
from enkflow.experiment.step import AnalysisStep
from enkflow.obs import ObsSet
from enkflow.online import Field, Problem, Runner, Server, ServerConfig, ServerLost

FIELD = Field("x", "float64", (6,))


class Identity(ObservationSpace):
    def observations(self, cycle):
        return ObsSet(np.full(6, float(cycle)), np.ones(6), np.arange(6.0)[:, None])

    def apply(self, cycle, X, row_start, comm):
        return X.copy()

    def apply_analysis(self, cycle, Xa, row_start, comm):
        return Xa


def _server(**kw) -> Server:
    def initial(store):
        store.parts[0][...] = np.arange(18.0).reshape(6, 3)

    p = Problem((FIELD,), 3, initial, lambda c: 1, Identity(),
                AnalysisStep(make_filter(AnalysisConfig.model_validate({"method": "etkf"}))))
    return Server(p, ServerConfig(token="tok", heartbeat_timeout_s=30, **kw))


def _runner(address, key, out, errors):
    try:
        with Runner(address, "tok", curve_server_key=key, reconnect_s=3) as r:
            r.init([FIELD])
            x = np.zeros(6)
            x, n = r.expose(x)
            while n:
                x += 1.0
                x, n = r.expose(x)
            out.append(True)
    except Exception as exc:
        errors.append(exc)


def test_the_server_listens_on_loopback_by_default():
    s = _server()
    try:
        assert s.address.startswith("tcp://127.0.0.1:")
        assert all(a.startswith("tcp://127.0.0.1:") for a in s.data_addresses)
    finally:
        s.close()


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_curve_encrypted_study_and_a_runner_without_the_key_is_shut_out():
    pub, sec = zmq.curve_keypair()
    s = _server(curve_secret_key=sec.decode())
    done, errors = [], []
    outsider_errors: list[Exception] = []
    outsider = threading.Thread(target=_runner, args=(s.address, None, [], outsider_errors))
    outsider.start()
    good = threading.Thread(target=_runner, args=(s.address, pub.decode(), done, errors))
    good.start()
    diag = s.run([1, 2])
    good.join(30)
    outsider.join(30)
    assert sorted(diag) == [1, 2] and done == [True] and not errors
    assert len(outsider_errors) == 1 and isinstance(outsider_errors[0], ServerLost)
