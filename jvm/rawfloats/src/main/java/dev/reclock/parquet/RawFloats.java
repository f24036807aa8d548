package dev.reclock.parquet;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import org.apache.parquet.bytes.LittleEndianDataOutputStream;

/**
 * Whether this JVM writes Parquet floats by their raw bits: called from Spark SQL as
 * {@code java_method('dev.reclock.parquet.RawFloats', 'keepsNaNPayloads')} on an executor, where parts
 * are written. True only when the LittleEndianDataOutputStream that class loading finds (the first on the
 * classpath) keeps a NaN's payload: Reclock's (this jar, ahead of the wheel's parquet-common), not
 * parquet-java's. A JVM without this class has not got the fix either (the call fails: class not found).
 */
public final class RawFloats {

  private RawFloats() {}

  public static boolean keepsNaNPayloads() {
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    try (LittleEndianDataOutputStream out = new LittleEndianDataOutputStream(bytes)) {
      out.writeFloat(Float.intBitsToFloat(0x7fc00123));
      out.writeDouble(Double.longBitsToDouble(0x7ff0000000000001L)); // a signalling NaN
    }
    catch (IOException e) {
      return false;
    }
    byte[] b = bytes.toByteArray();
    return b.length == 12
        && b[0] == 0x23 && b[1] == 0x01 && b[2] == (byte) 0xc0 && b[3] == 0x7f
        && b[4] == 0x01 && b[5] == 0 && b[6] == 0 && b[7] == 0 && b[8] == 0 && b[9] == 0
        && b[10] == (byte) 0xf0 && b[11] == 0x7f;
  }

  /** Where this JVM's LittleEndianDataOutputStream was loaded from (for error messages). */
  public static String writerSource() {
    java.security.CodeSource src = LittleEndianDataOutputStream.class.getProtectionDomain().getCodeSource();
    return src == null ? "(unknown)" : String.valueOf(src.getLocation());
  }
}
