#!/usr/bin/env bash
# The certificates of docker-compose.yaml's services, signed by a CA of your own, into docker/certs/ (or $1).
# Run once before `docker compose up` (needs openssl and the JDK's keytool; .env must set KAFKA_KEYSTORE_PASSWORD):
#   set -a; . ./.env; set +a; docker/make-certs.sh
# It keeps what exists: delete the folder to make new ones. Nothing here is a password but the Kafka key
# store's, which comes from the environment (never an argument). For real hosts, use your own CA.
set -euo pipefail
out=${1:-$(dirname "$0")/certs}
: "${KAFKA_KEYSTORE_PASSWORD:?set KAFKA_KEYSTORE_PASSWORD (from .env)}"
mkdir -p "$out"
cd "$out"
days=825

if [ ! -f ca.pem ]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key -out ca.pem \
    -days "$days" -subj "/CN=Reclock compose CA" -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# issue NAME CN SAN...: NAME.pem (certificate, then the CA's) and NAME.key (PKCS#8, mode 0600)
issue() {
  local name=$1 cn=$2; shift 2
  [ -f "$name.pem" ] && return 0
  local san
  san=$(printf 'DNS:%s,' "$@"); san=${san%,}
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$name.key" -out "$name.csr" \
    -subj "/CN=$cn" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$name.crt" -days "$days" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\n' \
    "$san,IP:127.0.0.1") 2>/dev/null
  cat "$name.crt" ca.pem > "$name.pem"
  rm -f "$name.csr" "$name.crt"
  chmod 600 "$name.key"
}

issue postgres postgres postgres localhost          # Postgres (TLS only)
issue broker broker kafka localhost                 # Kafka's listeners, inter-broker and controller (mutual TLS)
issue admin admin admin                             # Kafka's administrator (a super user): kafka-init
issue minio minio minio localhost                   # MinIO (S3 over TLS)
issue spark-connect spark-connect-tls spark-connect-tls localhost   # the TLS front of Spark Connect

# Kafka reads its key store as PKCS#12 (its password from the environment through Kafka's EnvVarConfigProvider)
if [ ! -f broker.p12 ]; then
  openssl pkcs12 -export -in broker.pem -inkey broker.key -name broker -out broker.p12 \
    -passout env:KAFKA_KEYSTORE_PASSWORD
  chmod 600 broker.p12
fi
# MinIO looks for public.crt and private.key in its certs folder
mkdir -p minio-certs
cp -n minio.pem minio-certs/public.crt
cp -n minio.key minio-certs/private.key
# S3A (Spark's JVMs) trusts the CA through a trust store; nothing in it is secret, so no password protects it
if [ ! -f truststore.p12 ]; then
  keytool -J-Dkeystore.pkcs12.certProtectionAlgorithm=NONE -J-Dkeystore.pkcs12.macAlgorithm=NONE -importcert \
    -noprompt -alias reclock-ca -file ca.pem -keystore truststore.p12 -storetype PKCS12 -storepass unprotected >/dev/null
fi
echo "certificates in $(pwd): ca.pem (trust this), postgres, broker (+ broker.p12), admin, minio, spark-connect, truststore.p12"
