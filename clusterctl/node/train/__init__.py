"""ImageNet training with TensorFlow 2 + Horovod: `python3 PYZ train ARGS` (main.py), launched by horovodrun.

One process per slot; rank 0 alone prints, checkpoints and writes TensorBoard summaries. The modules, one job
each: options.py (the flags), data.py (the input pipelines), model.py (the networks and the device, shared
with the benchmark), log.py (the lines for machines), resume.py (choosing, sealing and checking checkpoints,
the spot stop), checkpoints.py (their manifests and copies), spot.py (the spot interruption notice),
evaluate.py, elastic.py (the Elastic Horovod loop), main.py (a rank's run).

Data: ImageNet-format TFRecords in --data: `train-*` and `validation-*` shards of tf.train.Examples
with `image/encoded` (JPEG bytes) and `image/class/label`, which is 1-based as in the standard ImageNet
TFRecords (label 0 is the unused "background"; --label-offset 1 maps 1..C to 0..C-1). Optional
`image/object/bbox/{xmin,ymin,xmax,ymax}` guide the random crops, as for ImageNet. `clusterctl data`
writes this format, plus `labels.txt` (line N = class of label N) and `dataset.json` (counts), which
the trainer reads when present.

Output for machines (clusterctl.workloads.train.log parses it): every line starts with `CLUSTERCTL-TRAIN`; event lines
are `CLUSTERCTL-TRAIN <kind> key=value ...` (values shell-quoted when needed) and the table is

    CLUSTERCTL-TRAIN    Step   Epoch      img/s      Loss  TotalLoss         LR   Elapsed
    CLUSTERCTL-TRAIN      10    0.50      812.3    2.2910     2.3750   0.012500      14.2

(the recipe's Step/Epoch/Speed/Loss/FinLoss/LR table: img/s for all processes together, Loss the
cross-entropy averaged over all ranks and the steps since the last line, TotalLoss with weight decay,
Elapsed seconds since this process started). Kinds: device, start, resume, checkpoint, warning, done, eval,
error. `device` comes once per rank, first: `device rank=R host=H local_rank=L gpus=ID logical=N`, the GPU
the rank computes on as its node numbers it (gpus=none: the CPU), which clusterctl checks against the
node's slots.
`eval` carries top1/top5 in percent, and is followed by the same as one JSON line of its own
({"metric": top1, "top1": ..., "top5": ..., "eval_loss": ..., "step": ...}) for `clusterctl sweep`.

Fault tolerance: Horovod has none, so checkpoints are the way back. Rank 0 saves every
--checkpoint-every steps and at every epoch end (ckpt-<images seen, all ranks together>, the last
--keep-checkpoints kept, by images); on start it restores the one that has seen the most images (model,
optimizer state, step, epoch, images) and broadcasts it to every rank, so only rank 0 needs --model-dir.
Resumed on another number of processes, the run goes on from the step of this global batch at those images,
and the learning rate from the images exactly. After a resume the input pipeline starts a fresh shuffle; it
does not replay the exact images of the interrupted epoch.

Resuming: every variable the checkpoint tracks (the model, the optimizer with its momentum, and a loss-scale
optimizer's loss scale and its counter) goes from rank 0 to every rank after the restore, and at the end
the ranks compare a fingerprint of those variables (`sync` line). `hparams.json` beside the checkpoints
records the hyperparameters they were trained with; a resume under other ones is refused (exit 7): give
another --model-dir. Under `clusterctl sweep` (CLUSTERCTL_SWEEP and CLUSTERCTL_TRIAL set) the default
--model-dir is train_out/<sweep>/trial-<N>, one per trial.

Copies and spot: each saved checkpoint gets a manifest of its files and sizes, written last (a checkpoint
without one, or with a file missing or of another size, is never restored), and is copied in the
background to --checkpoint-copy HOST (the same folder there, over the leader's ssh) and to --checkpoint-to
s3://bucket/prefix (see checkpoints.py). On start, rank 0 restores the newest
complete checkpoint of all three places. With --spot-poll, each node's first process polls its instance's
spot interruption notice (IMDSv2); when one appears on any node, rank 0 checkpoints at once, waits for the
copies, and the job ends with status 8 (rank 0's; the others exit 0): start it again with the same command.

Elastic (--elastic, under horovodrun --min-np/--max-np --host-discovery-script): the training loop is
elastic.py's; no collective runs before it (a process that joins later
would meet the others in their state sync), so each rank prints its own `device` line and rank 0's restore
reaches the others in that sync. See elastic.py for what a commit keeps and the `world_size` lines.

Exit status: 0 done; 2 bad arguments; 3 Horovod size differs from --expect-size; 4 nothing to evaluate
or a checkpoint that does not fit the model; 5 no data files; 6 labels outside 0..classes-1 after
--label-offset; 7 the checkpoint was trained with other hyperparameters; 8 a spot notice (see above). The
job's own status 9 comes from horovodrun (the node package's): an elastic job had fewer than --min-np processes for
--elastic-timeout.
"""
