/*
 * Reclock's replacement of parquet-java's org.apache.parquet.bytes.LittleEndianDataOutputStream (Apache
 * License 2.0), with the same public API as parquet-common 1.17.0's. The one difference: writeFloat and
 * writeDouble write the value's raw bits (Float.floatToRawIntBits, Double.doubleToRawLongBits) where
 * parquet-java's call floatToIntBits / doubleToLongBits, which turn every NaN into the canonical NaN
 * (0x7fc00000, 0x7ff8000000000000): a NaN's payload and sign bit were lost on the way into a Parquet
 * file. PlainValuesWriter (plain pages and dictionary pages of FLOAT and DOUBLE columns) writes through
 * this class. Every other value is written exactly as before (floatToIntBits differs from the raw bits
 * only for NaNs).
 */
package org.apache.parquet.bytes;

import java.io.IOException;
import java.io.OutputStream;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** A little-endian writer of Java's primitive types onto an {@link OutputStream}. */
public class LittleEndianDataOutputStream extends OutputStream {

  private static final Logger LOG = LoggerFactory.getLogger(LittleEndianDataOutputStream.class);

  private final OutputStream out;
  private byte[] writeBuffer = new byte[8];

  public LittleEndianDataOutputStream(OutputStream out) {
    this.out = out;
  }

  @Override
  public void write(int b) throws IOException {
    out.write(b);
  }

  @Override
  public void write(byte[] b, int off, int len) throws IOException {
    out.write(b, off, len);
  }

  @Override
  public void flush() throws IOException {
    out.flush();
  }

  public final void writeBoolean(boolean v) throws IOException {
    out.write(v ? 1 : 0);
  }

  public final void writeByte(int v) throws IOException {
    out.write(v);
  }

  public final void writeShort(int v) throws IOException {
    out.write(v & 0xFF);
    out.write((v >>> 8) & 0xFF);
  }

  public final void writeInt(int v) throws IOException {
    out.write(v & 0xFF);
    out.write((v >>> 8) & 0xFF);
    out.write((v >>> 16) & 0xFF);
    out.write((v >>> 24) & 0xFF);
  }

  public final void writeLong(long v) throws IOException {
    writeBuffer[7] = (byte) (v >>> 56);
    writeBuffer[6] = (byte) (v >>> 48);
    writeBuffer[5] = (byte) (v >>> 40);
    writeBuffer[4] = (byte) (v >>> 32);
    writeBuffer[3] = (byte) (v >>> 24);
    writeBuffer[2] = (byte) (v >>> 16);
    writeBuffer[1] = (byte) (v >>> 8);
    writeBuffer[0] = (byte) v;
    out.write(writeBuffer, 0, 8);
  }

  /** The float's raw bits: a NaN keeps its payload and sign. */
  public final void writeFloat(float v) throws IOException {
    writeInt(Float.floatToRawIntBits(v));
  }

  /** The double's raw bits: a NaN keeps its payload and sign. */
  public final void writeDouble(double v) throws IOException {
    writeLong(Double.doubleToRawLongBits(v));
  }

  @Override
  public void close() {
    try (OutputStream os = this.out) {
      os.flush();
    } catch (Exception e) {
      LOG.debug("Exception in flush() or close()", e);
    }
  }
}
