package dev.reclock.spark;

import java.io.IOException;

import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocatedFileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RemoteIterator;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.OutputCommitter;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.lib.output.FileOutputFormat;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An output committer that moves nothing: Spark's file writes (SQLHadoopMapReduceCommitProtocol, given through
 * {@code spark.sql.parquet.output.committer.class} a committer that is not a FileOutputCommitter) put each task's
 * file straight at its final name in the output folder, and the job's commit writes {@code _SUCCESS} there.
 *
 * <p>On S3 that is one PUT per file (an S3 object appears whole or not at all) instead of the
 * FileOutputCommitter's two copies through {@code _temporary/}. Reclock's parts need no more: they are immutable,
 * uniquely named, and referenced only after Reclock has listed the folder, found {@code _SUCCESS}, and proved from
 * the files' footers that they hold exactly the rows the job reported (reclock.persist.staged.collect_parts).
 *
 * <p>Each task attempt writes files of its own names: {@link #setupTask} makes the attempt's file names start
 * with {@code part-a<attempt id>-} (Spark's writer names files {@code <mapreduce.output.basename>-<split>-<job
 * uuid>...}, reading the basename from the attempt's own configuration; Spark's attempt id is unique in the
 * application). That matters because Spark closes a failed or killed attempt's writer when it aborts it: the
 * Parquet file of the rows written so far is completed and uploaded. Under a shared name (Spark's default) a
 * speculative attempt killed after its twin succeeded, or a zombie attempt of a lost executor, could replace a
 * committed file with such a partial one, after the job ended. Under names of its own, an aborted attempt
 * never touches another attempt's file; {@link #abortTask} deletes what it wrote, and whatever is still there
 * when Reclock lists the folder (an attempt killed as the job ended) makes the rows differ from what the job
 * reported: the write fails loudly and nothing is appended. A file appearing after that listing is referenced
 * by nothing (Reclock records each part by its name) and is removed by Reclock's blob GC.
 */
public class DirectOutputCommitter extends OutputCommitter {
    /** The marker Reclock checks for: the job committed. */
    public static final String SUCCESS = "_SUCCESS";

    /** The Hadoop setting Spark's file writer names its files by (default {@code part}). */
    static final String BASENAME = "mapreduce.output.basename";

    private static final Logger LOG = LoggerFactory.getLogger(DirectOutputCommitter.class);

    public DirectOutputCommitter() {
    }

    /** The start of every file name of this task attempt ({@code part-a<attempt id>}). */
    static String attemptBasename(TaskAttemptContext taskContext) {
        return "part-a" + taskContext.getTaskAttemptID().getId();
    }

    @Override
    public void setupJob(JobContext jobContext) {
    }

    @Override
    public void commitJob(JobContext jobContext) throws IOException {
        Path out = FileOutputFormat.getOutputPath(jobContext);
        if (out == null) {
            throw new IOException("DirectOutputCommitter: the job has no output path");
        }
        FileSystem fs = out.getFileSystem(jobContext.getConfiguration());
        fs.create(new Path(out, SUCCESS), true).close();
        LOG.info("Committed job {} at {}", jobContext.getJobID(), out);
    }

    @Override
    public void setupTask(TaskAttemptContext taskContext) {
        // Spark's writer reads the basename from this very configuration (the attempt's own copy) when it
        // names the attempt's files, after setupTask
        taskContext.getConfiguration().set(BASENAME, attemptBasename(taskContext));
        // where each task attempt ran (an executor's log; reclock.dev.cluster reads it)
        LOG.info("Direct output of task '{}' to {}", taskContext.getTaskAttemptID(),
                FileOutputFormat.getOutputPath(taskContext));
    }

    @Override
    public boolean needsTaskCommit(TaskAttemptContext taskContext) {
        return false;
    }

    @Override
    public void commitTask(TaskAttemptContext taskContext) {
    }

    /** Deletes the files this attempt wrote (Spark has closed its writer: a partial file may be there). */
    @Override
    public void abortTask(TaskAttemptContext taskContext) throws IOException {
        Path out = FileOutputFormat.getOutputPath(taskContext);
        if (out == null) {
            return;
        }
        String mine = attemptBasename(taskContext) + "-";
        FileSystem fs = out.getFileSystem(taskContext.getConfiguration());
        int deleted = 0;
        try {
            RemoteIterator<LocatedFileStatus> files = fs.listFiles(out, true);
            while (files.hasNext()) {
                Path p = files.next().getPath();
                if (p.getName().startsWith(mine) && fs.delete(p, false)) {
                    deleted++;
                }
            }
        } catch (java.io.FileNotFoundException e) {
            // nothing was written
        }
        LOG.info("Aborted task '{}': deleted {} file(s) it wrote under {}", taskContext.getTaskAttemptID(), deleted,
                out);
    }
}
