"""Actuators: perform the pool sizes a :class:`~tangram_celery.autoscale.policy.Decision` sets.

One interface, :class:`Actuator`; the controller calls :meth:`Actuator.sizes` every tick and
:meth:`Actuator.scale` for each target, then :meth:`Actuator.step` to move drains along.

* :class:`LocalProcessActuator` (the embedded default): ``tangram worker cpu`` subprocesses on
  this machine, one per CPU pool member;
* :class:`DockerActuator`: the same members as containers (``docker`` SDK), labelled
  ``tangram.pool``, optionally as replicas of a compose service;
* :class:`KubernetesActuator`: the ``scale`` subresource of Deployments / StatefulSets (official
  ``kubernetes`` client), the path to many hosts;
* :class:`ActAwareAutoscaler`: inside one prefork worker, Celery's own autoscaler hook sized by
  the same policy.

The interface is in :mod:`.interface`; the local and Docker actuators share the member life
cycle of :mod:`.members`, which drains a CPU node before it stops.
"""

from __future__ import annotations

from tangram_celery.autoscale.actuators.autoscaler import ActAwareAutoscaler, worker_target
from tangram_celery.autoscale.actuators.docker import ContainerTemplate, DockerActuator
from tangram_celery.autoscale.actuators.interface import Actuator
from tangram_celery.autoscale.actuators.kubernetes import KubernetesActuator, Workload
from tangram_celery.autoscale.actuators.local import LocalProcessActuator
from tangram_celery.autoscale.actuators.members import NodeDrain

__all__ = [
    "ActAwareAutoscaler",
    "Actuator",
    "ContainerTemplate",
    "DockerActuator",
    "KubernetesActuator",
    "LocalProcessActuator",
    "NodeDrain",
    "Workload",
    "worker_target",
]
