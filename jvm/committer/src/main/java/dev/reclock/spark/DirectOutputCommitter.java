package dev.reclock.spark;

import java.io.IOException;

import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
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
 * the files' footers that they hold exactly the rows the job reported (reclock.persist.staged.collect_parts). A
 * file a failed task attempt left behind makes those counts differ: the write fails loudly and nothing is
 * appended (a retried attempt writes the same file name, replacing it whole). What a failed write leaves is
 * garbage no shard references, removed by Reclock's blob GC.
 */
public class DirectOutputCommitter extends OutputCommitter {
    /** The marker Reclock checks for: the job committed. */
    public static final String SUCCESS = "_SUCCESS";

    private static final Logger LOG = LoggerFactory.getLogger(DirectOutputCommitter.class);

    public DirectOutputCommitter() {
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

    @Override
    public void abortTask(TaskAttemptContext taskContext) {
    }
}
