"""sp2hf.py - writes a Hugging Face tokenizer.json equivalent to a LLaMA-style
sentencepiece BPE model (identity normalizer, add_dummy_prefix,
remove_extra_whitespaces off, byte fallback), for the peers that read
tokenizer.json (fastokens). Merges are derived from the vocabulary as
transformers' SentencePieceExtractor does: every split of a piece into two
pieces, ordered by the merged piece's score (highest first), then by the ids
of the parts. bench_encode.sh checks the peer's ids against spm_encode's.

usage: python3 sp2hf.py MODEL.model OUT.json   (needs Debian's spm_export_vocab)
"""
import json,sys,subprocess
model,out=sys.argv[1],sys.argv[2]
rows=subprocess.run(["spm_export_vocab","--model="+model],capture_output=True,text=True,check=True).stdout.split("\n")
pieces=[]
for r in rows:
    if not r: continue
    p,s=r.rsplit("\t",1); pieces.append((p,float(s)))
vocab={p:i for i,(p,s) in enumerate(pieces)}
special={"<unk>","<s>","</s>"}
merges=[]
for i,(p,s) in enumerate(pieces):
    if p in special or (p.startswith("<0x") and p.endswith(">")): continue
    local=[]
    for k in range(1,len(p)):
        l,r=p[:k],p[k:]
        if l in vocab and r in vocab: local.append((l,r,s))
    local.sort(key=lambda x:(vocab[x[0]],vocab[x[1]]))
    merges.extend(local)
merges.sort(key=lambda x:x[2],reverse=True)
added=[{"id":vocab[t],"content":t,"single_word":False,"lstrip":False,"rstrip":False,"normalized":False,"special":True} for t in ["<unk>","<s>","</s>"]]
tj={"version":"1.0","truncation":None,"padding":None,"added_tokens":added,
 "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"\u2581"},{"type":"Replace","pattern":{"String":" "},"content":"\u2581"}]},
 "pre_tokenizer":None,"post_processor":None,
 "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
 "model":{"type":"BPE","dropout":None,"unk_token":"<unk>","continuing_subword_prefix":None,"end_of_word_suffix":None,"fuse_unk":True,"byte_fallback":True,"ignore_merges":False,"vocab":vocab,"merges":[[l,r] for l,r,s in merges]}}
json.dump(tj,open(out,"w"),ensure_ascii=False)
