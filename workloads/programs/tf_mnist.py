"""MNIST-shaped classifier trained with TensorFlow's MultiWorkerMirroredStrategy.

Runs under the tensorflow-distributed runtime: its wrapper command sets ``TF_CONFIG`` from what
the Trainer injects (k8s/pods/tf_config.py) and execs this program, one TensorFlow worker per node
that drives all the node's GPUs (CPU when there are none). Needs only TensorFlow; the data is
generated (MNIST-shaped 28x28 digits, 10 classes, a learnable pattern), nothing is downloaded.

Training is a custom loop: each step's global batch is cut from a permutation that depends only
on (seed, epoch), one slice per replica in the sync group; gradients are summed across every
replica of every worker and SGD with momentum updates the mirrored variables.

Checkpoints (weights, momentum, step) go to ``--checkpoint-dir`` on the shared volume every
``--checkpoint-every`` steps and at the end, with ``tf.train.CheckpointManager``. Every worker
takes part in a save, but only the chief writes to the shared directory; the others write to a
temporary directory of their own, removed at the end (the chief rule is TensorFlow's
``multi_worker_util.is_chief``: the ``chief`` task, or worker 0 when the cluster has no chief;
the save pattern is the one of TensorFlow's "Custom training loop with Keras and
MultiWorkerMirroredStrategy" tutorial). The manager writes the checkpoint files first and then
replaces the ``checkpoint`` state file atomically (tensorflow/python/checkpoint/
checkpoint_management.py ``update_checkpoint_state_internal``, TF 2.20), so a crash mid-save
leaves the previous checkpoint as the latest. On start every worker restores the latest
checkpoint of the shared directory and continues at the next step with the same batches.

Exit codes: 2 bad arguments, 3 bad config or data (the runtimes fail the job at once on both).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines, before it is imported

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import trainer_status  # noqa: E402  (beside this program, as in the image)

EXIT_BAD_CONFIG = 3  # non-retryable: the runtime's failure policy fails the job at once
FAULT_ENV = "TRAINING_FAULT_AT_STEP"  # failure drills (tools/emulate.py): SIGKILL the node after step K
IMAGE_SIZE, CLASSES, HIDDEN = 28, 10, 128


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--checkpoint-dir", default="/mnt/checkpoints/tf-mnist")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = all epochs)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--synthetic-samples", type=int, default=60000, help="generated training samples")
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)  # usage errors exit 2
    for name in ("epochs", "batch_size", "checkpoint_every", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_steps < 0 or args.synthetic_samples < 1 or args.lr <= 0 or not 0 <= args.momentum < 1:
        p.error("--max-steps >= 0, --synthetic-samples >= 1, --lr > 0 and 0 <= --momentum < 1 are required")
    return args


def fail_config(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_CONFIG)


def synthetic_digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Learnable fake digits: class k lights up a k-dependent band of the image, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=n, dtype=np.int64)
    images = (rng.standard_normal((n, IMAGE_SIZE, IMAGE_SIZE)) * 0.5).astype(np.float32)
    for k in range(CLASSES):
        images[labels == k, 2 * k + 4 : 2 * k + 7, 4:24] += 2.0
    return images.reshape(n, IMAGE_SIZE * IMAGE_SIZE), labels


def is_chief(task_type: str | None, task_id: int | None, cluster: dict) -> bool:
    """TensorFlow's rule (multi_worker_util.is_chief): the chief task, else worker 0 of a cluster
    without one; a process without TF_CONFIG is a cluster of its own."""
    if task_type is None:
        return True
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and "chief" not in cluster)


class Mlp(tf.Module):
    """784 -> 128 (ReLU) -> 10; the initial weights depend only on the seed."""

    def __init__(self, seed: int):
        super().__init__()
        rng = np.random.default_rng(seed)

        def init(fan_in: int, fan_out: int) -> tf.Variable:
            limit = np.sqrt(6 / (fan_in + fan_out))  # Glorot uniform
            return tf.Variable(tf.constant(rng.uniform(-limit, limit, (fan_in, fan_out)), dtype=tf.float32))

        self.params = [
            init(IMAGE_SIZE * IMAGE_SIZE, HIDDEN), tf.Variable(tf.zeros([HIDDEN])),
            init(HIDDEN, CLASSES), tf.Variable(tf.zeros([CLASSES])),
        ]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        w1, b1, w2, b2 = self.params
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


class Velocities(tf.Module):
    def __init__(self, params: list[tf.Variable]):
        super().__init__()
        self.values = [tf.Variable(tf.zeros_like(p)) for p in params]


_STATUS = trainer_status.Reporter()  # the Trainer's status server, where it serves one


def event(chief: bool, kind: str, **fields) -> None:
    """Machine-readable progress line from the chief (the same format as the torch programs'); its
    steps and result also go to the Trainer (TrainJob.status.trainerStatus)."""
    if not chief:
        return
    print(f"TRAINING_EVENT {json.dumps({'event': kind, **fields}, sort_keys=True)}", flush=True)
    metrics = {k: fields[k] for k in ("loss", "epoch", "samples_per_s") if fields.get(k) is not None}
    if kind == "step":
        _STATUS.update(step=fields["step"], total_steps=fields.get("total_steps"), eta_s=fields.get("eta_s"), metrics=metrics)
    elif kind == "result":
        _STATUS.final(step=fields["final_step"], total_steps=fields["final_step"], eta_s=0, metrics={"loss": fields.get("final_loss")})


def fault_point(step: int) -> None:
    target = os.environ.get(FAULT_ENV)
    if target and int(target) == step:
        print(f"fault injection: SIGKILL node process group at step {step}", file=sys.stderr, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)


def main(argv=None) -> int:
    args = parse_args(argv)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    task_type = resolver.task_type if resolver is not None else None
    task_id = resolver.task_id if resolver is not None else None
    chief = is_chief(task_type, task_id, cluster)
    replicas = strategy.num_replicas_in_sync
    global_batch = args.batch_size * replicas
    images, labels = synthetic_digits(args.synthetic_samples, args.seed)
    steps_per_epoch = len(images) // global_batch
    if steps_per_epoch == 0:
        fail_config(f"{len(images)} samples are fewer than one global batch ({args.batch_size} x {replicas} replicas)")
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    with strategy.scope():
        model = Mlp(args.seed)
        velocities = Velocities(model.params)
        step_var = tf.Variable(tf.constant(0, dtype=tf.int64))
    checkpoint = tf.train.Checkpoint(model=model, velocities=velocities, step=step_var)
    write_dir = args.checkpoint_dir if chief else tempfile.mkdtemp(prefix=f"tf-checkpoint-{task_type}-{task_id}-")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=3 if chief else 1)

    def sgd(var, grad, velocity):
        velocity.assign(args.momentum * velocity + grad)
        return var.assign_sub(args.lr * velocity)

    def apply_gradients(distribution, grads):
        # cross-replica context: sum every replica's gradients, then update each mirrored copy
        summed = distribution.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, list(zip(grads, model.params, strict=True)))
        for grad, var, velocity in zip(summed, model.params, velocities.values, strict=True):
            distribution.extended.update(var, sgd, args=(grad, velocity), group=False)

    @tf.function
    def train_step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.params)
            tf.distribute.get_replica_context().merge_call(apply_gradients, args=(grads,))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)

    def batch(step: int):
        epoch, index = divmod(step, steps_per_epoch)
        order = np.random.default_rng([args.seed, epoch]).permutation(len(images))
        rows = order[index * global_batch : (index + 1) * global_batch]

        def part(source: np.ndarray):
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(source[rows[ctx.replica_id_in_sync_group * args.batch_size : (ctx.replica_id_in_sync_group + 1) * args.batch_size]])
            )

        return part(images), part(labels)

    latest = tf.train.latest_checkpoint(args.checkpoint_dir)
    resumed_from = None
    if latest:
        t0 = time.perf_counter()
        checkpoint.restore(latest).assert_existing_objects_matched()
        resumed_from = int(step_var.numpy())
        event(chief, "resumed", step=resumed_from, epoch=resumed_from // steps_per_epoch, path=latest, seconds=round(time.perf_counter() - t0, 4))
    step = resumed_from or 0
    print(f"tf worker {task_type}:{task_id} chief={chief} replicas={replicas} steps={step}->{total_steps}", flush=True)

    def save(at_step: int) -> None:
        t0 = time.perf_counter()
        step_var.assign(at_step)
        manager.save(checkpoint_number=at_step)  # every worker: non-chief ones into their own directory
        event(chief, "checkpoint", step=at_step, seconds=round(time.perf_counter() - t0, 4))

    last_loss = float("nan")
    window_start, window_steps = time.perf_counter(), 0
    attempt_start, attempt_first = time.perf_counter(), step
    try:
        while step < total_steps:
            x, y = batch(step)
            last_loss = float(train_step(x, y))
            step += 1
            window_steps += 1
            fault_point(step)
            if step % args.log_every == 0 or step == total_steps:
                seconds = time.perf_counter() - window_start
                rate = (step - attempt_first) / max(time.perf_counter() - attempt_start, 1e-9)  # this attempt's steps per second
                event(chief, "step", step=step, epoch=(step - 1) // steps_per_epoch, loss=round(last_loss, 6), samples_per_s=round(window_steps * global_batch / max(seconds, 1e-9), 1),
                      total_steps=total_steps, eta_s=round((total_steps - step) / rate, 1) if rate > 0 else None)
                window_start, window_steps = time.perf_counter(), 0
            if step % args.checkpoint_every == 0 or step == total_steps:
                save(step)
        event(chief, "result", final_step=step, final_loss=round(last_loss, 6), resumed_from_step=resumed_from, world_size=replicas)
    finally:
        if not chief:
            shutil.rmtree(write_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
